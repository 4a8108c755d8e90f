"""The chart's etcd defragmentation CronJob (``etcd.defrag``): rendered by default with the
servers' client certificate, gone with an empty schedule, without certificates when the
etcd is plain; and for real, the command it runs defragments an etcd started with the
chart's certificates."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segtxn.metastore.etcd_server import EtcdServer
from segtxn.operator.storeaccess import STORE_TLS_DIR
from tests.manifests.podsecurity import violations
from tests.manifests.support import CHART, Doc, template, validate
from tests.manifests.test_chart_etcd_tls import chart_etcd  # noqa: F401 (a fixture)

Helm = Callable[..., str]
CLIENT_TLS = "rel-segtxn-etcd-client-tls"


def cron_jobs(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] == "CronJob"]


def defrag_container(job: Doc) -> dict[str, Any]:
    spec = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return dict(container)


def test_a_cron_job_defragments_the_charts_etcd_with_its_client_certificate(
    helm: Helm,
) -> None:
    docs = template(helm)
    [job] = cron_jobs(docs)
    validate(job)
    assert violations(job) == []  # Pod Security "restricted"
    assert job["spec"]["schedule"] == "17 3 * * *"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"  # never two rounds at once
    container = defrag_container(job)
    assert container["command"] == ["segtxn"]
    assert container["args"] == [
        "store",
        "defrag",
        "--store=etcd://rel-segtxn-etcd.segtxn.svc:2379",
        "--min-free-mib=256",
        "--store-ca=/etc/segtxn/etcd/ca.crt",
        "--store-cert=/etc/segtxn/etcd/tls.crt",
        "--store-key=/etc/segtxn/etcd/tls.key",
    ]
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [volume] = pod["volumes"]
    assert volume["secret"]["secretName"] == CLIENT_TLS
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/etc/segtxn/etcd"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_an_empty_schedule_renders_no_cron_job(helm: Helm) -> None:
    assert cron_jobs(template(helm, "etcd.defrag.schedule=")) == []
    assert cron_jobs(template(helm, "etcd.enabled=false")) == []


def test_a_plain_etcd_is_defragmented_without_certificates(helm: Helm) -> None:
    [job] = cron_jobs(template(helm, "etcd.tls.enabled=false", "etcd.defrag.minFreeMiB=64"))
    validate(job)
    container = defrag_container(job)
    assert "--min-free-mib=64" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--store-c")]
    assert "volumeMounts" not in container


def test_the_schema_refuses_a_threshold_below_one_mib(helm: Helm) -> None:
    out = helm("template", "rel", str(CHART), "--set", "etcd.defrag.minFreeMiB=0", ok=False)
    assert "minFreeMiB" in out


def test_the_jobs_command_defragments_an_etcd_on_the_charts_certificates(
    helm: Helm,
    chart_etcd: tuple[EtcdServer, dict[str, Any], Path],  # noqa: F811
) -> None:
    server, _, root = chart_etcd
    [job] = cron_jobs(template(helm, "etcd.defrag.minFreeMiB=1"))
    args = defrag_container(job)["args"]
    # The pod's paths under the test's root; the Service's name is the local etcd's.
    args = [re.sub(r"=/etc/segtxn/etcd/", f"={root}/etc/segtxn/etcd/", a) for a in args]
    args = [f"--store={server.url()}" if a.startswith("--store=") else a for a in args]
    mount = root / "etc/segtxn/etcd"  # the client Secret's files, where the job mounts them
    mount.mkdir(parents=True)
    for path in (root / STORE_TLS_DIR.lstrip("/")).iterdir():
        (mount / path.name).write_bytes(path.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "segtxn.cli", *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["skipped"] == ""
    [member] = result["members"]
    assert member["leader"] is True
