"""The servers' ``--auth-*`` flags: refused when they cannot work (before anything starts),
and a real ``segtxn standalone`` process with security on (an ES256 public key) serving a
client that has a token, v4 transactions included: their calls between the coordinator and
the broker travel as the cluster role."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric import ec

from segtxn.cli.commands import main
from segtxn.client import Client
from segtxn.protocol.errors import ErrorName, ServerError
from tests import processes
from tests.auth.conftest import CLUSTER, PRODUCER_2, SECRET, ec_pair, token, write_policy
from tests.processes import ServerProcess


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ["standalone", "broker", "coordinator"])
def test_flags_that_cannot_work_are_usage_errors(command: str, tmp_path: Path) -> None:
    base = {
        "standalone": ["standalone"],
        "broker": ["broker", "--store", "memory://", "--advertise", "http://127.0.0.1:9",
                   "--data-dir", str(tmp_path / "d")],
        "coordinator": ["coordinator", "--store", "memory://", "--advertise", "http://127.0.0.1:9"],
    }[command]  # fmt: skip
    (tmp_path / "short").write_bytes(b"short")
    (tmp_path / "secret").write_bytes(SECRET)
    policy = str(write_policy(tmp_path / "policy.yaml"))
    code, out = _invoke(*base, "--auth-policy", policy)
    assert code == 2 and "without a token key" in out, out
    code, out = _invoke(
        *base, "--auth-token-secret", str(tmp_path / "short"), "--auth-policy", policy
    )
    assert code == 2 and "at least 32 bytes" in out, out
    code, out = _invoke(
        *base, "--auth-token-secret", str(tmp_path / "secret"), "--auth-policy", policy
    )
    assert code == 2 and "cluster role's token" in out, out


@pytest.fixture
def secured_standalone(
    tmp_path: Path, started: list[ServerProcess]
) -> tuple[ServerProcess, object]:
    pair = ec_pair()
    (tmp_path / "key.pem").write_bytes(pair.public_pem)
    (tmp_path / "cluster").write_text(token(CLUSTER, key=pair.private, algorithm="ES256"))
    server = processes.standalone(
        "--auth-public-key", str(tmp_path / "key.pem"),
        "--auth-policy", str(write_policy(tmp_path / "policy.yaml")),
        "--auth-cluster-token", str(tmp_path / "cluster"),
        "--auto-create-topics",
    )  # fmt: skip
    started.append(server)
    server.start()
    return server, pair.private


async def test_a_secured_standalone_serves_token_holders(
    secured_standalone: tuple[ServerProcess, ec.EllipticCurvePrivateKey],
) -> None:
    server, key = secured_standalone
    await server.ready()
    topic = "persistent://acme/orders/v4"
    async with Client(server.url, token=token(PRODUCER_2, key=key, algorithm="ES256")) as client:
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "app", initial_position="earliest")
        txn = await client.transaction().start("v4")
        await producer.send(b"v4-in-txn", txn=txn)
        await txn.commit()  # the coordinator ends it on the broker, as the cluster role
        assert (await consumer.receive(timeout_s=20)).value == b"v4-in-txn"
    async with Client(server.url, token=token(PRODUCER_2)) as wrong_key:  # HS256: refused
        with pytest.raises(ServerError) as caught:
            await wrong_key.create_producer(topic, timeout_s=5)
        assert caught.value.name is ErrorName.UNAUTHENTICATED
        assert "ES256" in caught.value.message
