"""The chart's etcd with TLS (``etcd.tls.enabled``, on by default): the CA, etcd's
certificate and the servers' client certificate Helm makes, etcd's flags requiring client
certificates on its client and peer ports, probes on a plain port of their own, the
created cluster naming the client Secret and the operator's pods reading it; nothing of it
switched off. And for real: an etcd started with the chart's certificates and a broker
process started with the ``--store-*`` flags the operator renders, reaching it."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from segtxn.metastore import StoreCredentials, StoreSettings, StoreUnavailable, open_store
from segtxn.metastore.etcd_server import EtcdServer, EtcdTls, find_etcd_binary, free_port
from segtxn.operator import render
from segtxn.operator.storeaccess import STORE_TLS_DIR
from tests.manifests.support import CHART, KUBE_VERSION, Doc, load_all, template, validate
from tests.manifests.test_chart_security import created, pod, rendered
from tests.operator.test_render import expand, parse
from tests.processes import broker
from tests.waiting import wait_until

Helm = Callable[..., str]
ETCD = "rel-segtxn-etcd"
NS = "segtxn"


def secrets(docs: list[Doc]) -> dict[str, dict[str, bytes]]:
    return {
        d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }


def etcd_container(docs: list[Doc]) -> dict[str, Any]:
    [sts] = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == ETCD]
    return dict(sts["spec"]["template"]["spec"]["containers"][0])


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def covers(pattern: str, host: str) -> bool:
    if not pattern.startswith("*."):
        return pattern == host
    label, _, rest = host.partition(".")
    return bool(label) and rest == pattern[2:]


def test_etcd_serves_tls_and_requires_client_certificates_by_default(helm: Helm) -> None:
    docs, spec = created(helm)  # every document validated for Kubernetes 1.30
    found = secrets(docs)
    assert sorted(found) == [f"{ETCD}-ca", f"{ETCD}-client-tls", f"{ETCD}-tls"]
    ca = found[f"{ETCD}-ca"]["ca.crt"]
    server, client = found[f"{ETCD}-tls"], found[f"{ETCD}-client-tls"]
    for data in (server, client):
        assert data["ca.crt"] == ca and "tls.key" in data
        cert(data["tls.crt"]).verify_directly_issued_by(cert(ca))
        usage = cert(data["tls.crt"]).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usage.value  # peers are clients too
    names = cert(server["tls.crt"]).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    dns = names.value.get_values_for_type(x509.DNSName)
    # The URL the created cluster uses, and every member's advertised client/peer name.
    for host in (f"{ETCD}.{NS}.svc", f"{ETCD}-2.{ETCD}-headless.{NS}.svc", "localhost"):
        assert any(covers(n, host) for n in dns), host

    container = etcd_container(docs)
    args = container["args"]
    for flag in ("--client-cert-auth", "--peer-client-cert-auth",
                 "--cert-file=/etc/etcd/tls/tls.crt", "--key-file=/etc/etcd/tls/tls.key",
                 "--trusted-ca-file=/etc/etcd/tls/ca.crt",
                 "--peer-cert-file=/etc/etcd/tls/tls.crt",
                 "--peer-trusted-ca-file=/etc/etcd/tls/ca.crt"):  # fmt: skip
        assert flag in args, flag
    urls = [
        a for a in args if re.match(r"--(listen|advertise|initial)-.*urls?=|--initial-cluster=", a)
    ]
    assert urls and all("http://" not in a for a in urls if "metrics" not in a), urls
    assert "--listen-metrics-urls=http://0.0.0.0:2381" in args
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    [sts] = [d for d in docs if d["kind"] == "StatefulSet"]
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert [v["secret"]["secretName"] for v in volumes] == [f"{ETCD}-tls"]  # never the CA's

    # The created cluster names the client Secret; the operator mounts it for its servers.
    assert spec["metadataStore"]["tls"] == {"secretName": f"{ETCD}-client-tls",
                                            "clientCertificate": True}  # fmt: skip
    for kind in ("StatefulSet", "Deployment"):
        container_args = pod(rendered(spec), kind)["containers"][0]["args"]
        assert f"--store-cert={STORE_TLS_DIR}/tls.crt" in container_args


def test_switched_off_etcd_is_plain_and_nothing_reads_certificates(helm: Helm) -> None:
    docs, spec = created(helm, "etcd.tls.enabled=false")
    assert secrets(docs) == {}
    args = etcd_container(docs)["args"]
    assert not [a for a in args if "cert" in a or "https://" in a], args
    assert "tls" not in spec["metadataStore"]
    for kind in ("StatefulSet", "Deployment"):
        spec_of = pod(rendered(spec), kind)
        assert not [a for a in spec_of["containers"][0]["args"] if a.startswith("--store-")]
        assert "store-tls" not in {v["name"] for v in spec_of.get("volumes", [])}


def test_the_etcd_alone_has_its_tls_without_a_created_cluster(helm: Helm) -> None:
    docs = template(helm)
    for doc in docs:
        validate(doc)
    assert f"{ETCD}-client-tls" in secrets(docs)  # for SegtxnClusters of one's own


@pytest.fixture
def chart_etcd(helm: Helm, tmp_path: Path) -> Iterator[tuple[EtcdServer, dict[str, Any], Path]]:
    """A real etcd on the chart's certificates and flags, the created cluster's spec, and
    a directory standing for the servers' pods' root, with the client Secret's files where
    the operator mounts them (what the kubelet does)."""
    docs, spec = created(helm, "cluster.security.enabled=false")
    found = secrets(docs)
    etc = tmp_path / "etcd"
    etc.mkdir()
    for key, value in found[f"{ETCD}-tls"].items():
        (etc / key).write_bytes(value)
    args = etcd_container(docs)["args"]
    flags = {"--cert-file=/etc/etcd/tls/tls.crt", "--key-file=/etc/etcd/tls/tls.key",
             "--trusted-ca-file=/etc/etcd/tls/ca.crt", "--client-cert-auth"}  # fmt: skip
    assert flags <= set(args)  # what EtcdTls gives the etcd started here
    server = EtcdServer.in_temp_dir(
        unsafe_no_fsync=True, tls=EtcdTls(etc / "tls.crt", etc / "tls.key", etc / "ca.crt")
    )
    root = tmp_path / "pod"
    mount = root / STORE_TLS_DIR.lstrip("/")
    mount.mkdir(parents=True)
    for key, value in found[spec["metadataStore"]["tls"]["secretName"]].items():
        (mount / key).write_bytes(value)
    server.start()
    try:
        yield server, spec, root
    finally:
        server.stop()


async def test_a_broker_reaches_the_charts_etcd_with_the_rendered_flags(
    chart_etcd: tuple[EtcdServer, dict[str, Any], Path], tmp_path: Path
) -> None:
    server, spec, root = chart_etcd
    objects = render.render_cluster("segtxn", NS, spec)
    [sts] = [o for o in objects if o["kind"] == "StatefulSet"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    rendered_args = expand(container, config)
    parse(rendered_args)  # the real CLI accepts what the pod runs
    store_flags = [
        re.sub(r"=/", f"={root}/", a, count=1) for a in rendered_args if a.startswith("--store-")
    ]
    assert len(store_flags) == 3, store_flags  # CA, certificate, key
    url = server.url("/segtxn")  # 127.0.0.1: an IP name of the chart's etcd certificate
    process = broker(url, tmp_path / "data", "b1", extra=(*store_flags, "--store-timeout", "20"))
    process.start()
    try:
        await process.ready()
    finally:
        process.stop()
    # Without the client certificate, etcd refuses the connection.
    ca_only = StoreCredentials(ca_file=root / STORE_TLS_DIR.lstrip("/") / "ca.crt")
    store = open_store(url, StoreSettings(request_timeout_s=1.0, credentials=ca_only))
    try:
        with pytest.raises(StoreUnavailable):
            await store.get("/k")
    finally:
        await store.close()


def _members(args: list[str], etc: Path, base: Path) -> list[list[str]]:
    """Three etcd members on loopback with the chart's TLS flags (their files in ``etc``)
    and its URL schemes, the rest of what the chart gives (names, paths) made local."""
    tls = [a.replace("/etc/etcd/tls", str(etc)) for a in args
           if "/etc/etcd/tls" in a or a.endswith("client-cert-auth")]  # fmt: skip
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]
    cluster = ",".join(f"m{i}=https://127.0.0.1:{p}" for i, (_, p, _) in enumerate(ports))
    commands = []
    for i, (client, peer, metrics) in enumerate(ports):
        commands.append([
            find_etcd_binary(), f"--name=m{i}", f"--data-dir={base / f'm{i}'}",
            f"--listen-client-urls=https://127.0.0.1:{client}",
            f"--advertise-client-urls=https://127.0.0.1:{client}",
            f"--listen-peer-urls=https://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=https://127.0.0.1:{peer}",
            f"--listen-metrics-urls=http://127.0.0.1:{metrics}",
            f"--initial-cluster={cluster}", "--initial-cluster-state=new",
            "--initial-cluster-token=chart-tls", "--unsafe-no-fsync", "--log-level=warn", *tls,
        ])  # fmt: skip
    return commands


@pytest.fixture
def chart_quorum(helm: Helm, tmp_path: Path) -> Iterator[tuple[list[str], StoreCredentials]]:
    """Three members started on the chart's certificates and TLS flags: their client
    endpoints, and the servers' client credentials (the client Secret's files)."""
    docs, _ = created(helm)
    found = secrets(docs)
    etc, client = tmp_path / "etcd-tls", tmp_path / "client"
    for directory, secret in ((etc, f"{ETCD}-tls"), (client, f"{ETCD}-client-tls")):
        directory.mkdir()
        for key, value in found[secret].items():
            (directory / key).write_bytes(value)
    commands = _members(etcd_container(docs)["args"], etc, tmp_path)
    assert sum("--peer-client-cert-auth" in c for c in commands) == 3
    endpoints = [next(a.split("https://")[1] for a in c if a.startswith("--advertise-client"))
                 for c in commands]  # fmt: skip
    quiet = subprocess.DEVNULL
    processes = [
        subprocess.Popen(c, start_new_session=True, stdout=quiet, stderr=quiet) for c in commands
    ]
    try:
        yield endpoints, StoreCredentials(client / "ca.crt", client / "tls.crt", client / "tls.key")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def test_three_members_form_a_quorum_over_the_charts_peer_tls(
    chart_quorum: tuple[list[str], StoreCredentials],
) -> None:
    """Peer TLS with client certificates required both ways (``--peer-client-cert-auth``),
    on etcd's certificate as Helm made it: the members elect a leader and replicate, and a
    client with the servers' certificate reaches each of them."""
    endpoints, credentials = chart_quorum
    settings = StoreSettings(request_timeout_s=2, credentials=credentials)
    stores = [open_store(f"etcd://{e}/chart", settings) for e in endpoints]
    try:

        async def written() -> bool:
            try:
                await stores[0].put("/quorum", b"over peer TLS")
            except StoreUnavailable:
                return False
            return True

        await wait_until(written, timeout=30, what="a write through the first member")
        for store in stores:  # a linearizable read on each member: replicated over peer TLS
            record = await store.get("/quorum")
            assert record is not None and record.value == b"over peer TLS"
    finally:
        for store in stores:
            await store.close()


def with_cert_manager(helm: Helm, *sets: str) -> list[Doc]:
    args = ["template", "rel", str(CHART), "--namespace", NS, "--kube-version", KUBE_VERSION,
            "--api-versions", "cert-manager.io/v1/Certificate"]  # fmt: skip
    for value in sets:
        args += ["--set", value]
    return load_all(helm(*args))


def test_cert_manager_issues_the_same_secrets_instead(helm: Helm) -> None:
    docs = with_cert_manager(helm, "etcd.tls.certificates=cert-manager", "cluster.create=true")
    assert secrets(docs) == {}  # cert-manager writes them
    certificates = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert sorted(certificates) == [f"{ETCD}-ca", f"{ETCD}-client-tls", f"{ETCD}-tls"]
    assert certificates[f"{ETCD}-ca"]["isCA"]
    server, client = certificates[f"{ETCD}-tls"], certificates[f"{ETCD}-client-tls"]
    assert server["secretName"] == f"{ETCD}-tls" and client["secretName"] == f"{ETCD}-client-tls"
    for host in (f"{ETCD}.{NS}.svc", f"{ETCD}-2.{ETCD}-headless.{NS}.svc", "localhost"):
        assert any(covers(n, host) for n in server["dnsNames"]), host
    assert "client auth" in server["usages"] and client["usages"][0] == "client auth"
    assert server["issuerRef"]["name"] == f"{ETCD}-ca"  # the etcd's own CA issuer
    assert server["duration"] == "87600h" and server["renewBefore"] == "720h"
    [sts] = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == ETCD]
    [volume] = sts["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == f"{ETCD}-tls"  # the same mount either way
    [cluster] = [d for d in docs if d["kind"] == "SegtxnCluster"]
    assert cluster["spec"]["metadataStore"]["tls"]["secretName"] == f"{ETCD}-client-tls"
    given = with_cert_manager(
        helm, "etcd.tls.certificates=cert-manager", "etcd.tls.certManagerIssuer.name=corp",
        "etcd.tls.certManagerIssuer.kind=ClusterIssuer",
    )  # fmt: skip
    assert not [d for d in given if d["kind"] == "Issuer"]  # no CA of its own
    issuers = {d["spec"]["issuerRef"]["name"] for d in given if d["kind"] == "Certificate"}
    assert issuers == {"corp"}
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION,
               "--set", "etcd.tls.certificates=cert-manager", ok=False)  # fmt: skip
    assert "this cluster has no cert-manager" in out
