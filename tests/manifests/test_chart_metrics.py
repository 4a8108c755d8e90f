"""The chart's monitoring switches, with a real helm: the Grafana dashboard ConfigMap and the
ServiceMonitor are off by default; on, they render valid objects; a ServiceMonitor asked
for on a cluster without its CRD is refused, saying why. And the operator's log format."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from segtxn.operator import security, securitynames
from tests.manifests.support import CHART, KUBE_VERSION, ROOT, Doc, load_all, template, validate

Helm = Callable[..., str]
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
DASHBOARD = CHART / "dashboards" / "segtxn.json"


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def with_monitoring_api(helm: Helm, *sets: str) -> list[Doc]:
    args = ["template", "rel", str(CHART), "--namespace", "segtxn", "--kube-version", KUBE_VERSION]
    args += ["--api-versions", SERVICE_MONITOR_API]
    for value in sets:
        args += ["--set", value]
    return load_all(helm(*args))


def documented_series(path: Path = ROOT / "docs" / "metrics.md") -> set[str]:
    """The family names docs/metrics.md lists (first column of its tables)."""
    return set(re.findall(r"^\| `(segtxn_[a-z0-9_]+)`", path.read_text(), re.MULTILINE))


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    docs = with_monitoring_api(helm)
    assert of_kind(docs, "ServiceMonitor") == []
    assert not [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]


def test_the_dashboard_config_map_holds_the_dashboard(helm: Helm) -> None:
    docs = template(helm, "metrics.dashboard.enabled=true")
    (config_map,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    validate(config_map)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["segtxn.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "segtxn-overview"
    other = template(helm, "metrics.dashboard.enabled=true", "metrics.dashboard.namespace=grafana")
    (moved,) = [
        d for d in of_kind(other, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert moved["metadata"]["namespace"] == "grafana"


def test_every_dashboard_query_uses_documented_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    documented = documented_series()
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"\b(segtxn_[a-z0-9_]+)", target["expr"]):
                queried.add(re.sub(r"_(bucket|count|sum)$", "", name))
    assert queried, "the dashboard queries nothing"
    assert queried <= documented, queried - documented
    assert all(p["gridPos"]["w"] <= 24 for p in dashboard["panels"])


def test_the_service_monitor_scrapes_brokers_and_coordinators_once(helm: Helm) -> None:
    docs = with_monitoring_api(
        helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"
    )
    (monitor,) = of_kind(docs, "ServiceMonitor")
    spec = monitor["spec"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "segtxn-operator"
    (components,) = spec["selector"]["matchExpressions"]
    assert components["values"] == ["broker", "coordinator"]
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    (drop,) = endpoint["relabelings"]
    assert drop["action"] == "drop" and re.fullmatch(drop["regex"], "orders-broker-headless")
    assert not re.fullmatch(drop["regex"], "orders-broker")
    watched = with_monitoring_api(
        helm, "metrics.serviceMonitor.enabled=true", "operator.watchNamespaces={team-a,team-b}"
    )
    (scoped,) = of_kind(watched, "ServiceMonitor")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_a_service_monitor_without_its_crd_is_refused_clearly(helm: Helm) -> None:
    args = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION]
    out = helm(*args, "--set", "metrics.serviceMonitor.enabled=true", ok=False)
    assert "no ServiceMonitor kind (monitoring.coreos.com/v1)" in out
    bad = helm(*args, "--set", "metrics.serviceMonitor.interval=soon", ok=False)
    assert "metrics.serviceMonitor.interval" in bad


def test_the_operator_logs_in_the_format_asked_for(helm: Helm) -> None:
    def operator_args(*sets: str) -> list[str]:
        (deployment,) = [
            d
            for d in of_kind(template(helm, *sets), "Deployment")
            if d["metadata"]["name"].endswith("-operator")
        ]
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--log-format=text" in operator_args()
    assert "--log-format=json" in operator_args("operator.logFormat=json")
    args = ["template", "rel", str(CHART), "--kube-version", KUBE_VERSION]
    assert "operator.logFormat" in helm(*args, "--set", "operator.logFormat=xml", ok=False)


def test_a_secured_created_cluster_is_scraped_over_https(helm: Helm) -> None:
    """Its brokers and coordinators each get a ServiceMonitor of their own: ``https``, the
    cluster's CA from the brokers' certificate Secret, a server name their certificate
    has (Prometheus scrapes pod addresses), the admin token and certificate when asked;
    the plain one leaves them out."""
    sets = ("cluster.create=true", "metrics.serviceMonitor.enabled=true")
    docs = with_monitoring_api(helm, *sets)
    plain, brokers, coordinators = of_kind(docs, "ServiceMonitor")
    excluded = plain["spec"]["selector"]["matchExpressions"][1]
    assert excluded == {"key": "app.kubernetes.io/instance", "operator": "NotIn",
                        "values": ["segtxn"]}  # fmt: skip
    for monitor, component, names in [
        (brokers, "broker", securitynames.broker_dns_names("segtxn", "segtxn")),
        (coordinators, "coordinator", securitynames.coordinator_dns_names("segtxn", "segtxn")),
    ]:
        labels = monitor["spec"]["selector"]["matchLabels"]
        assert labels["app.kubernetes.io/component"] == component
        assert labels["app.kubernetes.io/instance"] == "segtxn"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["scheme"] == "https"
        tls = endpoint["tlsConfig"]
        assert tls["serverName"] in names
        assert tls["ca"]["secret"] == {"name": securitynames.broker_tls_secret("segtxn"),
                                       "key": "ca.crt"}  # fmt: skip
        assert "authorization" not in endpoint and "cert" not in tls
    admin = securitynames.token_secret("segtxn", security.ADMIN_ROLE)
    guarded = with_monitoring_api(
        helm, *sets, "cluster.security.protectMetrics=true",
        "cluster.security.clientCertificates=true",
    )  # fmt: skip
    for monitor in of_kind(guarded, "ServiceMonitor")[1:]:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["authorization"]["credentials"] == {"name": admin, "key": "token"}
        assert endpoint["tlsConfig"]["keySecret"] == {"name": admin, "key": "tls.key"}
    # Security off: one plain ServiceMonitor for everything, as before.
    (only,) = of_kind(with_monitoring_api(helm, *sets, "cluster.security.enabled=false"),
                      "ServiceMonitor")  # fmt: skip
    assert len(only["spec"]["selector"]["matchExpressions"]) == 1
