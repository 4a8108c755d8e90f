"""The CRDs: structural, valid as Kubernetes objects, and the sample resources fit them."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.manifests.support import CRDS, ROOT, crd_schemas, load_all, validate

EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
API = "segtxn.io/v1alpha1"


def crds() -> list[dict[str, Any]]:
    return [doc for path in sorted(CRDS.glob("*.yaml")) for doc in load_all(path.read_text())]


def nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def defaulted(doc: Mapping[str, Any], schema: Mapping[str, Any]) -> Any:
    """What the API server stores: ``default`` filled in where a field is absent."""
    if schema.get("type") != "object" or not isinstance(doc, Mapping):
        return copy.deepcopy(doc)
    out = {k: copy.deepcopy(v) for k, v in doc.items()}
    for name, child in schema.get("properties", {}).items():
        if name not in out and "default" in child:
            out[name] = copy.deepcopy(child["default"])
        if name in out:
            out[name] = defaulted(out[name], child)
    return out


@pytest.mark.parametrize("crd", crds(), ids=lambda c: c["metadata"]["name"])
def test_crd_is_a_valid_kubernetes_object(crd: dict[str, Any]) -> None:
    validate(crd)
    assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"


@pytest.mark.parametrize("crd", crds(), ids=lambda c: c["metadata"]["name"])
def test_crd_schema_is_structural(crd: dict[str, Any]) -> None:
    """Kubernetes' structural-schema rules that a YAML slip breaks: every node typed,
    properties only on objects, no properties beside additionalProperties."""
    for version in crd["spec"]["versions"]:
        for path, node in nodes(version["schema"]["openAPIV3Schema"]):
            typed = "type" in node or node.get("x-kubernetes-int-or-string")
            assert typed or node.get("x-kubernetes-preserve-unknown-fields"), path
            if "properties" in node:
                assert node["type"] == "object", path
                assert "additionalProperties" not in node, path
            if "default" in node and "properties" in node:  # defaults must fit their node
                jsonschema.validate(node["default"], node)


@pytest.mark.parametrize(
    "crd",
    [c for c in crds() if c["spec"]["group"] == "segtxn.io"],
    ids=lambda c: c["spec"]["names"]["kind"],
)
def test_segtxn_crds_have_status_and_columns_that_exist(crd: dict[str, Any]) -> None:
    for version in crd["spec"]["versions"]:
        assert version["subresources"] == {"status": {}}
        schema = version["schema"]["openAPIV3Schema"]
        paths = {path for path, _ in nodes(schema)} | {".metadata.creationTimestamp"}
        for column in version["additionalPrinterColumns"]:
            assert column["jsonPath"] in paths, column


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_fit_their_crds_before_and_after_defaulting(path: Path) -> None:
    schemas = crd_schemas()
    for doc in load_all(path.read_text()):
        validate(doc)
        validate(defaulted(doc, schemas[(doc["apiVersion"], doc["kind"])]))


CONNECTION_LIMITS: list[tuple[dict[str, Any], str]] = [
    ({"maxConnections": 0}, "less than the minimum"),  # 0 is the CLI's "automatic": absent
    ({"maxConnections": 1.5}, "is not of type 'integer'"),
    ({"maxConnections": "1k"}, "is not of type 'integer'"),
    ({"maxConnectionsPerIp": 0}, "less than the minimum"),  # the CLI's "no limit": absent
    ({"maxConnectionsPerIp": -1}, "less than the minimum"),
    ({"idleTimeoutSeconds": 0}, "less than the minimum"),
    ({"idleTimeoutSeconds": 0.5}, "less than the minimum"),
    ({"idleTimeoutSeconds": 31536001}, "greater than the maximum"),
    ({"idleTimeoutSeconds": "75s"}, "is not of type 'number'"),
]
"""Connection limits the servers refuse (or read as another thing), for both kinds."""

BAD = [
    ("SegtxnCluster", {"metadataStore": {"url": "http://etcd:2379"}}, "does not match"),
    (
        "SegtxnCluster",
        {"metadataStore": {"url": "etcd://e:2379"}, "brokers": {"replicas": 0}},
        "less than the minimum",
    ),
    ("SegtxnCluster", {}, "'metadataStore' is a required property"),
    (
        "SegtxnCluster",
        {"metadataStore": {"url": "etcd://e:2379"}, "brokers": {"storage": {"size": "ten gigs"}}},
        "does not match",
    ),
    (
        "SegtxnCluster",
        {
            "metadataStore": {"url": "etcd://e:2379"},
            "brokers": {"settings": {"retentionTimeSeconds": -2}},
        },
        "less than the minimum",
    ),
    (
        "SegtxnCluster",
        {
            "metadataStore": {"url": "etcd://e:2379"},
            "brokers": {"settings": {"retentionBytes": "1G"}},
        },
        "is not of type 'integer'",
    ),
    (  # below the largest message: the broker would refuse to start
        "SegtxnCluster",
        {
            "metadataStore": {"url": "etcd://e:2379"},
            "brokers": {"settings": {"publishBufferBytes": 5 * 1024 * 1024 - 64 * 1024 - 1}},
        },
        "less than the minimum",
    ),
    (
        "SegtxnCluster",
        {
            "metadataStore": {"url": "etcd://e:2379"},
            "brokers": {"settings": {"publishBufferBytes": "256Mi"}},
        },
        "is not of type 'integer'",
    ),
    (
        "SegtxnCluster",
        {
            "metadataStore": {"url": "etcd://e:2379"},
            "brokers": {"settings": {"publishBufferBytes": 67108864.5}},
        },
        "is not of type 'integer'",
    ),
    *(  # the servers' connection limits (tests/operator/test_connection_limits.py)
        (
            "SegtxnCluster",
            {"metadataStore": {"url": "etcd://e:2379"}, "brokers": {"settings": settings}},
            complaint,
        )
        for settings, complaint in CONNECTION_LIMITS
    ),
    *(
        ("TransactionCoordinator", {"clusterRef": "c", **spec}, complaint)
        for spec, complaint in CONNECTION_LIMITS
    ),
    ("TransactionCoordinator", {"replicas": 2}, "'clusterRef' is a required property"),
    (
        "TransactionCoordinator",
        {"clusterRef": "c", "gcBacklogThreshold": 0},
        "less than the minimum",
    ),
    (
        "ScalableTopic",
        {"clusterRef": "c", "tenant": "a/b", "namespace": "n", "topic": "t"},
        "does not match",
    ),
    (
        "ScalableTopic",
        {"clusterRef": "c", "tenant": "t", "namespace": "n", "topic": "t", "targetSegments": 0},
        "less than the minimum",
    ),
    (
        "ScalableTopic",
        {
            "clusterRef": "c",
            "tenant": "t",
            "namespace": "n",
            "topic": "t",
            "autoscale": {"enabled": True, "split": {"msgRateIn": -1}},
        },
        "less than the minimum",
    ),
    (
        "ScalableTopic",
        {
            "clusterRef": "c",
            "tenant": "t",
            "namespace": "n",
            "topic": "t",
            "autoscale": {"enabled": "yes"},
        },
        "is not of type 'boolean'",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "complaint"), BAD)
def test_bad_resources_are_refused(kind: str, spec: dict[str, Any], complaint: str) -> None:
    doc = {"apiVersion": API, "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate(doc)


def test_crd_topic_names_match_the_protocol() -> None:
    """The CRD's name patterns and lengths are the ones segtxn.protocol.names enforces."""
    from segtxn.protocol import limits, names
    from segtxn.topics.model import MAX_INITIAL_SEGMENTS

    spec = crd_schemas()[(API, "ScalableTopic")]["properties"]["spec"]
    fields = spec["properties"]
    assert fields["tenant"]["pattern"] == names.schema_pattern(limits.MAX_TENANT)
    assert fields["namespace"]["pattern"] == names.schema_pattern(limits.MAX_NAMESPACE)
    assert fields["topic"]["pattern"] == names.schema_pattern(limits.MAX_LOCAL_NAME)
    assert fields["initialSegments"]["maximum"] == MAX_INITIAL_SEGMENTS
    for field, limit in (("tenant", limits.MAX_TENANT), ("namespace", limits.MAX_NAMESPACE),
                         ("topic", limits.MAX_LOCAL_NAME)):  # fmt: skip
        assert fields[field]["maxLength"] == limit  # bounds the CEL rules' cost


NAMES = [
    ("t", "n", "x" * 128),  # 130: fits
    ("t" * 6, "n" * 6, "x" * 128),  # 140: the limit
    ("t" * 6, "n" * 7, "x" * 128),  # 141
    ("t=", "n", "x" * 128),  # 131 as typed, 133 as stored
    ("t" + "=" * 20, "n" * 40, "x" * 40),  # 101 as typed, 141 as stored
    ("a=b", "c=d", "e=" * 40),  # 86 as typed, 178 as stored
]


@pytest.mark.parametrize("name", NAMES, ids=lambda n: "/".join(x[:8] for x in n))
def test_the_crd_weighs_a_topic_name_as_the_brokers_do(name: tuple[str, str, str]) -> None:
    """The CEL rule on the three parts' length refuses exactly what segtxn.protocol.names
    refuses (a '=' is quoted in file names: it counts 3). No CEL runs here: the rule uses
    only size(), '.replace()', '+' and '<=', which mean the same in Python, so it is
    evaluated as Python with size = len."""
    from segtxn.protocol import limits

    spec = crd_schemas()[(API, "ScalableTopic")]["properties"]["spec"]
    [rule] = [v["rule"] for v in spec["x-kubernetes-validations"]
              if "size(self.tenant" in v["rule"]]  # fmt: skip
    assert re.fullmatch(r"[a-z.(), '=+<]+\d+", rule), rule  # nothing but what Python shares
    tenant, namespace, topic = name
    part = type("Spec", (), {"tenant": tenant, "namespace": namespace, "topic": topic})
    accepted = eval(rule, {"__builtins__": {}}, {"size": len, "self": part})
    stored = sum(limits.storage_length(p) for p in name)
    assert accepted == (stored <= limits.MAX_TOPIC_PARTS)


def _around_the_limits() -> Iterator[tuple[str, str, str]]:
    """Names with one part at, just below and just above its limit as the brokers weigh it
    (a '=' counts 3), with 0, 1 or 2 '=' in it; and parts each rule alone refuses."""
    from segtxn.protocol import limits

    small = ["t", "n", "x"]
    for i, limit in enumerate((limits.MAX_TENANT, limits.MAX_NAMESPACE, limits.MAX_LOCAL_NAME)):
        for equals in (0, 1, 2):
            for stored in (limit - 1, limit, limit + 1):
                name = list(small)
                name[i] = "a" * (stored - 3 * equals) + "=" * equals
                yield (name[0], name[1], name[2])
    yield from NAMES
    yield ("a" + "=" * 21, "n", "x")  # 22 characters as typed, 64 as stored
    yield ("a" + "=" * 22, "n", "x")  # 23 as typed, 67 as stored
    yield ("t", "n" * 64, "x" * 76)  # each part fits, 141 together
    for bad in ("", "=a", "-a", "a b", "a/b", "a%3D", "é", "a\n"):
        yield (bad, "n", "x")
        yield ("t", "n", bad)


def _name_rules(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field or "", rule) of every CEL rule on the topic's name: the whole name's, on
    the spec, and each part's own."""
    found = [("", v["rule"]) for v in spec["x-kubernetes-validations"]
             if "size(self.tenant" in v["rule"]]  # fmt: skip
    for field in ("tenant", "namespace", "topic"):
        own = spec["properties"][field].get("x-kubernetes-validations", [])
        found += [(field, v["rule"]) for v in own]
    return found


def _shown(name: tuple[str, str, str]) -> str:
    """A test id: short parts as they are, long ones as their length and their '='s."""
    return "/".join(p if len(p) <= 8 else f"{len(p)}chars{p.count('=')}eq" for p in name)


@pytest.mark.parametrize("name", list(_around_the_limits()), ids=_shown)
def test_the_crd_admits_a_topic_name_when_the_brokers_do(name: tuple[str, str, str]) -> None:
    """Schema (pattern, maxLength) and every CEL rule on the name together admit exactly
    the names segtxn.protocol.names parses: a part the CRD took but the brokers refuse
    would leave the ScalableTopic failing for ever. The rules are evaluated as Python, as
    above (size = len; '.replace()' means the same)."""
    from segtxn.protocol.names import InvalidTopicName, TopicName

    spec = crd_schemas()[(API, "ScalableTopic")]["properties"]["spec"]
    tenant, namespace, topic = name
    fields = {"clusterRef": "c", "tenant": tenant, "namespace": namespace, "topic": topic}
    doc = {"apiVersion": API, "kind": "ScalableTopic", "metadata": {"name": "x"}, "spec": fields}
    try:
        validate(doc)
    except jsonschema.ValidationError:
        admitted = False
    else:
        whole = type("Spec", (), {"tenant": tenant, "namespace": namespace, "topic": topic})
        # The API server's RE2 ends "$" at the end of the text; Python's lets a "\n" by.
        admitted = all(
            re.fullmatch(spec["properties"][f]["pattern"].strip("^$"), fields[f])
            for f in ("tenant", "namespace", "topic")
        )
        for field, rule in _name_rules(spec):
            assert re.fullmatch(r"[a-z.(), '=+<]+\d+", rule), rule  # nothing but what Python shares
            this = fields[field] if field else whole
            admitted &= bool(eval(rule, {"__builtins__": {}}, {"size": len, "self": this}))
    try:
        TopicName.parse(f"topic://{tenant}/{namespace}/{topic}")
    except InvalidTopicName:
        parsed = False
    else:
        parsed = True
    assert admitted == parsed


def test_no_crd_has_a_rule_twice() -> None:
    for crd in crds():
        for version in crd["spec"]["versions"]:
            for path, node in nodes(version["schema"]["openAPIV3Schema"]):
                rules = [v["rule"] for v in node.get("x-kubernetes-validations", [])]
                assert len(rules) == len(set(rules)), (crd["metadata"]["name"], path)


def test_images_pin_the_extras_versions() -> None:
    """The Spark image is Apache's at the pyspark version the `spark` extra pins."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pyspark = next(d for d in extras["spark"] if d.startswith("pyspark=="))
    version = pyspark.split("==")[1]
    dockerfile = (ROOT / "manifests" / "spark" / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.M)
    assert base and base.group(1).startswith(f"apache/spark:{version}-")
    assert "python3" in base.group(1)
    segtxn = (ROOT / "manifests" / "Dockerfile").read_text()
    assert '"segtxn[operator]"' in segtxn and "USER 10001" in segtxn


def test_store_url_and_storage_are_immutable_in_the_crd() -> None:
    """The API server refuses a changed store URL or broker storage itself (CEL transition
    rules; kmock does not run CEL, so the operator's own refusal is tested in
    tests/operator)."""
    spec = crd_schemas()[(API, "SegtxnCluster")]["properties"]["spec"]
    url = spec["properties"]["metadataStore"]["properties"]["url"]
    assert [v["rule"] for v in url["x-kubernetes-validations"]] == ["self == oldSelf"]
    storage = spec["properties"]["brokers"]["properties"]["storage"]
    assert [v["rule"] for v in storage["x-kubernetes-validations"]] == ["self == oldSelf"]


def test_crd_autoscale_defaults_are_the_policys() -> None:
    """What the CRD defaults and documents is what segtxn.topics.autoscale.Policy uses
    when a knob is absent; autoscale and targetSegments are refused together."""
    from segtxn.topics.autoscale import Policy

    spec = crd_schemas()[(API, "ScalableTopic")]["properties"]["spec"]
    knobs = spec["properties"]["autoscale"]["properties"]
    policy = Policy()
    assert knobs["maxSegments"]["default"] == policy.max_segments
    assert knobs["minSegments"]["default"] == policy.min_segments
    assert knobs["maxDagDepth"]["default"] == policy.max_dag_depth
    for side, load in (("split", policy.split), ("merge", policy.merge)):
        fields = knobs[side]["properties"]
        for key, value in zip(("msgRateIn", "bytesRateIn", "msgRateOut", "bytesRateOut"),
                              load.axes(), strict=True):  # fmt: skip
            assert fields[key]["description"].endswith(f"({value:.0f}).")
    assert knobs["split"]["properties"]["cooldownSeconds"]["description"].endswith(
        f"({policy.split_cooldown_s:.0f})."
    )
    merge = knobs["merge"]["properties"]
    assert merge["cooldownSeconds"]["description"].endswith(f"({policy.merge_cooldown_s:.0f}).")
    assert merge["windowSeconds"]["description"].endswith(f"({policy.merge_window_s:.0f}).")
    rules = " ".join(v["rule"] for v in spec["x-kubernetes-validations"])
    assert "self.autoscale.enabled && has(self.targetSegments)" in rules


def _security_rules() -> list[str]:
    spec = crd_schemas()[(API, "SegtxnCluster")]["properties"]["spec"]
    return [v["rule"] for v in spec["properties"]["security"]["x-kubernetes-validations"]]


@pytest.mark.parametrize(
    ("security", "admitted"),
    [
        ({"renewBeforeDays": 30, "certificateDays": 365, "tokenDays": 365}, True),
        ({"renewBeforeDays": 13, "certificateDays": 14, "tokenDays": 14}, True),
        ({"renewBeforeDays": 30, "certificateDays": 14, "tokenDays": 365}, False),
        ({"renewBeforeDays": 30, "certificateDays": 365, "tokenDays": 30}, False),
        ({"clientCertificates": True, "certificates": "operator"}, True),
        ({"clientCertificates": False, "certificates": "cert-manager"}, True),
        ({"clientCertificates": True, "certificates": "cert-manager"}, False),
    ],
)
def test_the_security_rules_refuse_what_cannot_run(
    security: dict[str, Any], admitted: bool
) -> None:
    """A renewal window not shorter than the validity (everything re-issued on every renewal
    pass) and client certificates from cert-manager are refused at admission, as the
    operator refuses them (tests/operator/test_security.py). CEL evaluated here by
    tests/manifests/celeval.py, on the spec as stored (defaults filled in)."""
    from tests.manifests.celeval import evaluate

    schema = crd_schemas()[(API, "SegtxnCluster")]["properties"]["spec"]["properties"]
    stored = defaulted(security, schema["security"])
    assert all(evaluate(rule, stored) for rule in _security_rules()) is admitted


@pytest.mark.parametrize(
    ("size", "admitted"),
    [("10Gi", True), ("0.5Gi", True), ("1", True), ("100Mi", True), ("1.5Ti", True),
     ("0", False), ("0Gi", False), ("0.0", False), ("00Mi", False), ("-1Gi", False),
     ("1e3", False), ("ten", False)],
)  # fmt: skip
def test_broker_storage_is_a_quantity_above_zero(size: str, admitted: bool) -> None:
    """The brokers' volume: "0" would make a claim no provisioner fills (pods Pending)."""
    spec = {"metadataStore": {"url": "etcd://e:2379"}, "brokers": {"storage": {"size": size}}}
    doc = {"apiVersion": API, "kind": "SegtxnCluster", "metadata": {"name": "x"}, "spec": spec}
    if admitted:
        validate(doc)
    else:
        with pytest.raises(jsonschema.ValidationError):
            validate(doc)


@pytest.mark.parametrize("kind", ["TransactionCoordinator", "VerificationRun"])
@pytest.mark.parametrize(
    ("ref", "admitted"),
    [("demo", True), ("demo-1.a", True), ("Demo_1", False), ("-demo", False), ("d" * 254, False)],
)
def test_a_cluster_ref_is_an_object_name(kind: str, ref: str, admitted: bool) -> None:
    """A typo that could never name a SegtxnCluster is refused at admission, not waited
    for (``WaitingForCluster``, every 5 s) for ever."""
    doc = {"apiVersion": API, "kind": kind, "metadata": {"name": "x"}, "spec": {"clusterRef": ref}}
    if admitted:
        validate(doc)
    else:
        with pytest.raises(jsonschema.ValidationError):
            validate(doc)
