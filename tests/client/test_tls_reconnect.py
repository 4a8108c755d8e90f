"""A consumer's stream and a producer that reconnect to a broker whose TLS certificate the
client no longer trusts fail at once, saying so: ``receive()`` raises the
CertificateError, an acknowledgment made after it and a send in flight fail with
ConnectionLost naming it, and a send made later raises it. Before, the CertificateError
ended the stream's (and the producer's) reconnecting task with nobody told: ``receive()``
waited forever, and acks and sends waited out their timeouts. A Reader (whose stream is a
consumer's) and a scalable topic's producer (a Producer per segment) are told alike; a
Reader's later ``receive()`` raises the error again (before, it waited for nothing).

Real components: an in-process broker with TLS on (certificates made by tests/auth/certs.py)
on the embedded store, restarted on its port with a certificate of a CA the client does not
trust (what a restart with a misconfigured certificate does to connected clients).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from segtxn.auth import AuthSettings, TlsSettings
from segtxn.broker.app import BrokerServer
from segtxn.broker.settings import BrokerSettings
from segtxn.client import CertificateError, Client, ClientError, Message
from segtxn.client.consumer import Consumer
from segtxn.client.producer import Producer
from segtxn.client.scalable import ScalableProducer
from segtxn.metastore import MetadataStore, open_store
from segtxn.web import Listener
from tests.auth.certs import Authority, authority, issue
from tests.waiting import client_error_of, wait_until

pytestmark = pytest.mark.timeout(120)
TOPIC = "persistent://acme/tls/reconnect"
SCALABLE = "topic://acme/tls/reconnect-keyed"
LONG_S = 60.0
"""Far longer than the test may take: a call that waits for it fails the test."""
PROMPTLY_S = 10.0


@dataclass
class TlsBroker:
    store: MetadataStore
    settings: BrokerSettings
    ca: Authority
    broker: BrokerServer

    @property
    def url(self) -> str:
        return self.settings.advertise_url

    async def stop(self) -> None:
        await self.broker.stop()

    async def start_untrusted(self, directory: Path) -> None:
        """Start the broker again on its port with a certificate signed by a CA the
        client does not trust."""
        stranger = authority(directory, "stranger-ca")
        cert, key = issue(stranger, directory, "stranger")
        tls = TlsSettings(cert, key, stranger.path)
        settings = replace(self.settings, auth=AuthSettings.from_files(tls=tls))
        self.broker = BrokerServer(settings, store=self.store)
        await self.broker.start()


@pytest.fixture
async def tls_broker(tmp_path: Path) -> AsyncIterator[TlsBroker]:
    ca = authority(tmp_path, "cluster-ca")
    cert, key = issue(ca, tmp_path, "server")
    store = open_store("memory://")
    listener = Listener("127.0.0.1")  # its port, held from the pick on (a restart binds it)
    settings = BrokerSettings(
        broker_id="b1",
        advertise_url=f"https://127.0.0.1:{listener.port}",
        ledger_url=f"file://{tmp_path / 'ledgers'}",
        auth=AuthSettings.from_files(tls=TlsSettings(cert, key, ca.path)),
    )
    broker = BrokerServer(settings, store=store, listener=listener)
    await broker.start()
    server = TlsBroker(store, settings, ca, broker)
    try:
        yield server
    finally:
        await server.broker.stop()
        await store.close()


def _failure(call: Awaitable[object]) -> Awaitable[ClientError]:
    """The error ``call`` fails with, which it must do within PROMPTLY_S."""
    return client_error_of(
        call, within_s=PROMPTLY_S, what="the call, on a broker whose certificate is not trusted,"
    )


async def _consumer_with(client: Client, n: int) -> tuple[Consumer, list[Message]]:
    await client.admin.create_topic(TOPIC)
    await client.admin.create_subscription(TOPIC, "s", initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(n):
        await producer.send(b"m%d" % i)
    await producer.close()
    consumer = await client.subscribe(TOPIC, "s")
    assert isinstance(consumer, Consumer)
    return consumer, [await consumer.receive(timeout_s=10) for _ in range(n)]


async def test_a_consumer_whose_broker_is_no_longer_trusted_is_told(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    async with Client(tls_broker.url, tls_ca=tls_broker.ca.path) as client:
        consumer, got = await _consumer_with(client, 2)
        receiving = asyncio.ensure_future(consumer.receive(timeout_s=LONG_S))
        await tls_broker.stop()
        await wait_until(lambda: bool(consumer.reconnecting()), what="the connection lost")
        await tls_broker.start_untrusted(tmp_path)
        error = await _failure(receiving)
        assert isinstance(error, CertificateError), repr(error)
        assert "certificate does not verify" in str(error), str(error)
        # the stream no longer reconnects: an ack made now fails at once, saying why
        ack = asyncio.ensure_future(consumer.acknowledge(got[0], timeout_s=LONG_S))
        acked = await _failure(ack)
        assert type(acked).__name__ == "ConnectionLost", repr(acked)
        assert isinstance(acked, ClientError) and acked.retriable, repr(acked)  # never sent
        assert "certificate does not verify" in str(acked), str(acked)
        # its one stream no longer reconnects: a later receive() raises it again, rather
        # than waiting for a message that cannot come
        later = await _failure(asyncio.ensure_future(consumer.receive(timeout_s=LONG_S)))
        assert isinstance(later, CertificateError), repr(later)


async def test_a_producer_whose_broker_is_no_longer_trusted_is_told(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    async with Client(tls_broker.url, tls_ca=tls_broker.ca.path) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC, send_timeout_s=LONG_S)
        assert isinstance(producer, Producer)
        await producer.send(b"before")
        await tls_broker.stop()
        await wait_until(lambda: not producer._connected.is_set(), what="the connection lost")
        sending = asyncio.ensure_future(producer.send(b"during"))
        await tls_broker.start_untrusted(tmp_path)
        error = await _failure(sending)
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert "certificate does not verify" in str(error), str(error)
        assert isinstance(error, ClientError) and error.retriable, repr(error)  # never sent
        assert "sending it again is safe" in str(error), str(error)
        with pytest.raises(CertificateError, match="certificate does not verify"):
            async with asyncio.timeout(PROMPTLY_S):
                await producer.send(b"after")


async def test_a_reader_whose_broker_is_no_longer_trusted_is_told(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    """A Reader's stream is a consumer's (MessageStream): its ``receive()`` waiting when
    the reconnect meets the certificate raises the CertificateError, and so does a later
    one (the stream no longer reconnects: nothing could arrive)."""
    async with Client(tls_broker.url, tls_ca=tls_broker.ca.path) as client:
        await client.admin.create_topic(TOPIC)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"before")
        await producer.close()
        reader = await client.create_reader(TOPIC)
        assert (await reader.receive(timeout_s=10)).value == b"before"
        receiving = asyncio.ensure_future(reader.receive(timeout_s=LONG_S))
        await tls_broker.stop()
        await wait_until(lambda: not reader._stream.attached, what="the connection lost")
        await tls_broker.start_untrusted(tmp_path)
        error = await _failure(receiving)
        assert isinstance(error, CertificateError), repr(error)
        assert "certificate does not verify" in str(error), str(error)
        later = await _failure(asyncio.ensure_future(reader.receive(timeout_s=LONG_S)))
        assert isinstance(later, CertificateError), repr(later)


async def test_a_scalable_producer_whose_broker_is_no_longer_trusted_is_told(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    """A scalable topic's producer sends through one Producer per segment, which share
    its reconnecting: a send in flight on a segment whose broker is no longer trusted
    fails with ConnectionLost naming the certificate, and a later one to that segment
    raises the CertificateError, each within PROMPTLY_S, not at its send timeout."""
    async with Client(tls_broker.url, tls_ca=tls_broker.ca.path) as client:
        await client.admin.create_topic(SCALABLE, segments=1)
        producer = await client.create_producer(SCALABLE, send_timeout_s=LONG_S)
        assert isinstance(producer, ScalableProducer)
        await producer.send(b"before")
        (segment,) = producer._producers.values()
        await tls_broker.stop()
        await wait_until(lambda: not segment._connected.is_set(), what="the connection lost")
        sending = asyncio.ensure_future(producer.send(b"during"))
        await tls_broker.start_untrusted(tmp_path)
        error = await _failure(sending)
        assert type(error).__name__ == "ConnectionLost", repr(error)
        assert "certificate does not verify" in str(error), str(error)
        assert isinstance(error, ClientError) and error.retriable, repr(error)  # never sent
        after = await _failure(asyncio.ensure_future(producer.send(b"after")))
        assert isinstance(after, CertificateError), repr(after)
        assert "certificate does not verify" in str(after), str(after)


async def test_a_scalable_topics_layout_whose_broker_is_no_longer_trusted_says_so(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    """A scalable topic's lookup session (its layout, which producers route with and
    consumers follow to new segments) reconnecting to a broker whose certificate is not
    trusted stops and says so: whoever waits for a layout change is woken within
    PROMPTLY_S, and ``failed`` is the CertificateError (no change will come). Before, the
    error ended the session's task with nobody told: a consumer waiting for the segments
    of a split, or a send waiting for the layout after its segment was sealed, waited for a
    change that could not come."""
    async with Client(tls_broker.url, tls_ca=tls_broker.ca.path) as client:
        await client.admin.create_topic(SCALABLE, segments=1)
        producer = await client.create_producer(SCALABLE, send_timeout_s=LONG_S)
        assert isinstance(producer, ScalableProducer)
        layout = producer.layout
        changed = layout.changed
        await tls_broker.stop()
        await tls_broker.start_untrusted(tmp_path)
        async with asyncio.timeout(PROMPTLY_S):
            await changed.wait()
        assert isinstance(layout.failed, CertificateError), repr(layout.failed)
        assert "certificate does not verify" in str(layout.failed), str(layout.failed)
