"""A secured SegtxnCluster through the operator (Kopf against kmock; no segtxn processes):
its Secrets are created once and reused, mounted into the brokers and coordinators with
the flags that read them, renewed when due; cert-manager's objects instead when asked;
nothing of it with the switch off; a policy the servers would refuse is refused whole."""

from __future__ import annotations

import asyncio
import base64
import datetime
import re
from typing import Any

import aiohttp
import jwt
import kmock
import kopf
import pytest
import yaml

from segtxn.auth.policy import Policy
from segtxn.operator import pki, security, securitynames
from segtxn.operator.kube import Kube
from segtxn.operator.sessions import ClusterSessions
from tests.operator.emulator import NS, Emulator, emulator, operator
from tests.operator.support import WAIT_S, condition, condition_of, config_of, offline
from tests.operator.test_rbac import SECURED, declared, observed
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
STORE = "etcd://e:2379/security"
STS, DEPLOY, SECRETS = "apps/v1/statefulsets", "apps/v1/deployments", "v1/secrets"
ROLES = {"orders-app": [{"resource": "acme/orders", "actions": ["produce", "consume"]}]}
SECURITY = {"enabled": True, "roles": ROLES, "superusers": ["ops"]}
CLUSTER_SECRETS = [
    "demo-ca",
    "demo-broker-tls",
    "demo-token-signer",
    "demo-auth",
    "demo-token-segtxn-admin",
    "demo-token-orders-app",
    "demo-token-ops",
]
ALL_SECRETS = [*CLUSTER_SECRETS, "demo-coordinator-tls"]


def data(emu: Emulator, name: str) -> dict[str, bytes]:
    found = emu.get(SECRETS, name)
    assert found is not None, name
    return {k: base64.b64decode(v) for k, v in found["data"].items()}


def live(emu: Emulator, resource: str, name: str) -> dict[str, Any]:
    found = emu.get(resource, name)
    assert found is not None, name
    return found


def container(emu: Emulator, resource: str, name: str) -> dict[str, Any]:
    found = emu.get(resource, name)
    assert found is not None, name
    return dict(found["spec"]["template"]["spec"]["containers"][0])


def volumes(emu: Emulator, resource: str, name: str) -> dict[str, Any]:
    found = emu.get(resource, name)
    assert found is not None, name
    return {v["name"]: v for v in found["spec"]["template"]["spec"].get("volumes", [])}


async def secured(emu: Emulator, **extra: Any) -> None:
    spec = {"metadataStore": {"url": STORE}, "security": {**SECURITY, **extra}}
    await emu.create("SegtxnCluster", "demo", spec)
    await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo"})


async def test_secrets_are_created_once_mounted_and_reused_until_due() -> None:
    async with emulator() as emu, operator(emu, offline()):
        await secured(emu)
        await wait_until(
            lambda: (
                all(emu.get(SECRETS, s) for s in ALL_SECRETS)
                and emu.get(DEPLOY, "demo-coordinator") is not None
                and emu.get(STS, "demo-broker") is not None
            ),
            timeout=WAIT_S,
            what="the Secrets and both workloads",
        )
        first = {name: data(emu, name) for name in ALL_SECRETS}
        ca = first["demo-ca"]["tls.crt"]
        # Every certificate is the CA's, for the names the servers are reached by.
        for name in ("demo-broker-tls", "demo-coordinator-tls"):
            assert pki.signed_by(first[name]["tls.crt"], ca) and first[name]["ca.crt"] == ca
        assert "*.demo-broker-headless.segtxn.svc" in pki.dns_names_of(
            first["demo-broker-tls"]["tls.crt"]
        )
        assert f"*.{NS}.pod" in pki.dns_names_of(first["demo-coordinator-tls"]["tls.crt"])
        # Tokens: each role's, signed with the operator's key, whose public half the servers get.
        key = first["demo-token-signer"]["private.pem"]
        assert first["demo-auth"]["public.pem"] == pki.public_key_pem(key)
        for role, secret in [
            ("segtxn-cluster", "demo-auth"),
            ("orders-app", "demo-token-orders-app"),
        ]:
            token = first[secret]["cluster.jwt" if secret == "demo-auth" else "token"].decode()
            assert pki.token_verifies(token, key)
            assert jwt.decode(token, options={"verify_signature": False})["sub"] == role
        assert first["demo-token-segtxn-admin"]["ca.crt"] == ca
        assert live(emu, SECRETS, "demo-ca")["metadata"]["ownerReferences"][0]["kind"] == (
            "SegtxnCluster"
        )
        tc_owner = live(emu, SECRETS, "demo-coordinator-tls")["metadata"]["ownerReferences"][0]
        assert tc_owner["kind"] == "TransactionCoordinator"

        # Mounted, and read by the flags; probes over HTTPS.
        for resource, name, tls in [
            (STS, "demo-broker", "demo-broker-tls"),
            (DEPLOY, "demo-coordinator", "demo-coordinator-tls"),
        ]:
            mounted = volumes(emu, resource, name)
            assert mounted["tls"]["secret"]["secretName"] == tls
            assert mounted["auth"]["secret"]["secretName"] == "demo-auth"
            args = container(emu, resource, name)["args"]
            assert "--tls-cert=/etc/segtxn/tls/tls.crt" in args
            assert "--auth-public-key=/etc/segtxn/auth/public.pem" in args
            assert "--auth-cluster-token=/etc/segtxn/auth/cluster.jwt" in args
            assert any(a.startswith("--advertise=https://") for a in args)
            assert container(emu, resource, name)["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert "--pod-dns=segtxn.pod" in container(emu, DEPLOY, "demo-coordinator")["args"]
        config = config_of(emu)
        assert config is not None
        policy = Policy.parse(yaml.safe_load(config["data"]["policy.yaml"]))
        assert policy.principal("segtxn-cluster").superuser and policy.principal("ops").superuser

        # A spec change re-renders everything and writes no Secret again.
        versions = {n: live(emu, SECRETS, n)["metadata"]["resourceVersion"] for n in ALL_SECRETS}
        await emu.patch("SegtxnCluster", "demo", {"spec": {"image": "segtxn:0.2.0"}})
        await wait_until(
            lambda: container(emu, STS, "demo-broker")["image"] == "segtxn:0.2.0",
            timeout=WAIT_S,
            what="the new image applied",
        )
        assert {n: live(emu, SECRETS, n)["metadata"]["resourceVersion"] for n in ALL_SECRETS} == (
            versions
        )
        assert {name: data(emu, name) for name in ALL_SECRETS} == first

        # A broker certificate due for renewal (ends within renewBeforeDays) is issued
        # again at the next reconcile, by the same CA; the rest stays.
        now = datetime.datetime.now(datetime.UTC)
        names = securitynames.broker_dns_names("demo", NS)
        due = pki.issue_server(
            pki.Issued(ca, first["demo-ca"]["tls.key"]), names[0], names, now, days=10
        )
        files = {"tls.crt": due.cert_pem, "tls.key": due.key_pem, "ca.crt": ca}
        encoded = {k: base64.b64encode(v).decode() for k, v in files.items()}
        code, body = await emu.call(
            "PATCH", f"/api/v1/namespaces/{NS}/secrets/demo-broker-tls", {"data": encoded}
        )
        assert code == 200, body
        await emu.patch("SegtxnCluster", "demo", {"spec": {"image": "segtxn:0.3.0"}})
        await wait_until(
            lambda: data(emu, "demo-broker-tls")["tls.crt"] not in (due.cert_pem,),
            timeout=WAIT_S,
            what="the due certificate renewed",
        )
        renewed = data(emu, "demo-broker-tls")["tls.crt"]
        assert pki.signed_by(renewed, ca)
        assert pki.expires(renewed) > now + datetime.timedelta(days=300)
        assert data(emu, "demo-ca") == first["demo-ca"]
        assert data(emu, "demo-token-orders-app") == first["demo-token-orders-app"]
        assert any(r == "SecretIssued" and "demo-broker-tls" in m for _, r, m in emu.events("demo"))


async def test_with_the_switch_off_nothing_of_it_is_rendered_or_read() -> None:
    async with emulator() as emu, operator(emu, offline()):
        emu.requests = []
        spec = {"metadataStore": {"url": STORE}, "security": {"enabled": False, "roles": ROLES}}
        await emu.create("SegtxnCluster", "demo", spec)
        await emu.create("TransactionCoordinator", "demo", {"clusterRef": "demo"})
        await wait_until(
            lambda: (
                emu.get(DEPLOY, "demo-coordinator") is not None
                and emu.get(STS, "demo-broker") is not None
            ),
            timeout=WAIT_S,
            what="both workloads",
        )
        for resource, name in [(STS, "demo-broker"), (DEPLOY, "demo-coordinator")]:
            assert volumes(emu, resource, name) == {}
            args = container(emu, resource, name)["args"]
            assert not [a for a in args if a.startswith(("--tls", "--auth", "--pod-dns"))]
            assert any(a.startswith("--advertise=http://") for a in args)
        config = config_of(emu)
        assert config is not None and "policy.yaml" not in config["data"]
        assert not [s for s in emu.requests if s.plural in ("secrets", "certificates", "issuers")]
        assert all(emu.get(SECRETS, s) is None for s in ALL_SECRETS)


async def test_cert_manager_certificates_instead_of_the_operators_own() -> None:
    async with emulator() as emu, operator(emu, offline()):
        await secured(emu, certificates="cert-manager")
        certs = "cert-manager.io/v1/certificates"
        await wait_until(
            lambda: (
                emu.get(certs, "demo-broker-tls") is not None
                and emu.get(certs, "demo-coordinator-tls") is not None
                and emu.get(STS, "demo-broker") is not None
            ),
            timeout=WAIT_S,
            what="the Certificates and the brokers",
        )
        broker = emu.get(certs, "demo-broker-tls")
        assert broker is not None
        assert broker["spec"]["secretName"] == "demo-broker-tls"
        assert broker["spec"]["dnsNames"] == securitynames.broker_dns_names("demo", NS)
        assert broker["spec"]["issuerRef"]["name"] == "demo-ca"
        ca_certificate = emu.get(certs, "demo-ca")
        assert ca_certificate is not None and ca_certificate["spec"]["isCA"] is True
        issuers = "cert-manager.io/v1/issuers"
        assert live(emu, issuers, "demo-selfsigned")["spec"] == {"selfSigned": {}}
        assert live(emu, issuers, "demo-ca")["spec"] == {"ca": {"secretName": "demo-ca"}}
        # cert-manager writes the certificates' Secrets; the operator only the tokens'.
        assert emu.get(SECRETS, "demo-ca") is None and emu.get(SECRETS, "demo-broker-tls") is None
        assert "ca.crt" not in data(emu, "demo-token-segtxn-admin")  # not known yet
        assert volumes(emu, STS, "demo-broker")["tls"]["secret"]["secretName"] == "demo-broker-tls"
        # The operator's calls wait for cert-manager's CA, then take it from the brokers'
        # Secret before it is copied into the admin token's.
        kube = Kube(kopf.ConnectionInfo(server=str(emu.url), insecure=True))
        sessions = ClusterSessions()
        spec = (emu.mine("SegtxnCluster", "demo") or {})["spec"]
        async with aiohttp.ClientSession() as plain:
            try:
                with pytest.raises(kopf.TemporaryError, match="demo-token-segtxn-admin"):
                    await sessions.session(kube, plain, NS, "demo", spec)
                ca = pki.new_ca("cert-manager's", datetime.datetime.now(datetime.UTC))
                written = {"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "demo-broker-tls", "namespace": NS},
                           "data": {"ca.crt": base64.b64encode(ca.cert_pem).decode()}}  # fmt: skip
                code, body = await emu.call("POST", f"/api/v1/namespaces/{NS}/secrets", written)
                assert code in (200, 201), body
                secured_session = await sessions.session(kube, plain, NS, "demo", spec)
                assert secured_session is not plain
                assert await sessions.session(kube, plain, NS, "demo", spec) is secured_session
            finally:
                await sessions.close()
                await kube.close()


async def test_a_policy_the_servers_would_refuse_is_refused_whole() -> None:
    async with emulator() as emu, operator(emu, offline()):
        spec = {"metadataStore": {"url": STORE},
                "security": {"enabled": True, "superusers": ["segtxn-admin"]}}  # fmt: skip
        await emu.create("SegtxnCluster", "demo", spec)
        await wait_until(
            lambda: condition(emu, "SegtxnCluster", "demo", "Applied") == "False",
            timeout=WAIT_S,
            what="Applied False",
        )
        applied = condition_of(emu, "SegtxnCluster", "demo", "Applied")
        assert applied is not None
        assert applied["reason"] == "InvalidSecurity" and "reserved" in applied["message"]
        assert emu.get(STS, "demo-broker") is None and emu.get(SECRETS, "demo-ca") is None


@pytest.mark.parametrize("enabled", [True, False], ids=["on", "off"])
async def test_a_role_name_that_cannot_name_its_secret_is_refused_whole(enabled: bool) -> None:
    """The CRD checks a role name's length only (a regex over a map's keys costs the API
    server too much): the operator refuses the rest, switch on or off, as the CRD's rule
    did."""
    async with emulator() as emu, operator(emu, offline()):
        roles = {"Orders_App": ROLES["orders-app"]}
        spec = {"metadataStore": {"url": STORE},
                "security": {"enabled": enabled, "roles": roles}}  # fmt: skip
        await emu.create("SegtxnCluster", "demo", spec)
        await wait_until(
            lambda: condition(emu, "SegtxnCluster", "demo", "Applied") == "False",
            timeout=WAIT_S,
            what="Applied False",
        )
        applied = condition_of(emu, "SegtxnCluster", "demo", "Applied")
        assert applied is not None
        assert applied["reason"] == "InvalidSecurity"
        assert "'Orders_App' is not a DNS label" in applied["message"]
        assert emu.get(STS, "demo-broker") is None and emu.get(SECRETS, "demo-ca") is None


def test_the_crd_bounds_the_roles_as_the_operator_does() -> None:
    """The CRD's bounds are the operator's: as many roles, names as long (the form of a
    name is the operator's alone, above)."""
    from tests.manifests.support import crd_schemas

    sec = crd_schemas()[("segtxn.io/v1alpha1", "SegtxnCluster")]["properties"]["spec"][
        "properties"
    ]["security"]["properties"]
    assert sec["roles"]["maxProperties"] == security.MAX_ROLES
    assert sec["superusers"]["items"]["maxLength"] == security.MAX_ROLE_NAME
    [rule] = sec["roles"]["x-kubernetes-validations"]
    assert rule["rule"] == f"self.all(r, size(r) <= {security.MAX_ROLE_NAME})"
    assert sec["superusers"]["items"]["pattern"] == f"^{security.ROLE_NAME.pattern}$"
    too_many: dict[str, list[Any]] = {f"r{i}": [] for i in range(security.MAX_ROLES + 1)}
    with pytest.raises(security.InvalidSecurity, match="at most 64 roles"):
        security.check({"security": {"roles": too_many}})
    with pytest.raises(security.InvalidSecurity, match="not a DNS label"):
        security.check({"security": {"superusers": ["x" * (security.MAX_ROLE_NAME + 1)]}})
    security.check({"security": {"roles": {"x" * security.MAX_ROLE_NAME: []}}})


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"certificateDays": 14}, "renewBeforeDays (30) must be below certificateDays (14)"),
        ({"renewBeforeDays": 60, "tokenDays": 60}, "must be below tokenDays (60)"),
        (
            {"clientCertificates": True, "certificates": "cert-manager"},
            "clientCertificates: needs certificates: operator",
        ),
    ],
    ids=["certificates", "tokens", "client-certificates"],
)
def test_what_the_crds_security_rules_refuse_the_operator_refuses(
    fields: dict[str, Any], complaint: str
) -> None:
    """A renewal window not shorter than the validity would make every renewal pass (each
    5 minutes) re-issue every certificate and token; cert-manager cannot issue the roles'
    client certificates. Refused with security on, before anything is applied (the
    reconcile handler calls this check first); with it off they do no harm, and a cluster
    admitted before the CRD's rules existed must not be refused by an operator upgrade."""
    on = {"security": {**fields, "enabled": True}}
    with pytest.raises(security.InvalidSecurity, match=re.escape(complaint)):
        security.check(on)
    with pytest.raises(security.InvalidSecurity, match=re.escape(complaint)):
        security.SecuritySpec.of(on).policy()
    security.check({"security": fields})
    window = {"renewBeforeDays": 13, "certificateDays": 14, "tokenDays": 14}
    security.check({"security": {**window, "enabled": True}})


async def test_what_a_secured_cluster_sends_is_granted_and_every_secured_grant_is_used() -> None:
    """The grants only a secured cluster needs (test_rbac.py's SECURED) are sent, by the
    operator's own certificates and by cert-manager's, and all it sends is granted."""
    async with emulator() as emu, operator(emu, offline()):
        emu.requests = []
        await secured(emu)
        spec = {"metadataStore": {"url": STORE},
                "security": {"enabled": True, "certificates": "cert-manager"}}  # fmt: skip
        await emu.create("SegtxnCluster", "certs", spec)
        await wait_until(
            lambda: (
                emu.get(SECRETS, "demo-coordinator-tls") is not None
                and emu.get("cert-manager.io/v1/certificates", "certs-broker-tls") is not None
                and emu.get(STS, "certs-broker") is not None
            ),
            timeout=WAIT_S,
            what="both clusters secured",
        )
        seen = observed(emu.requests)
    assert seen - declared() == set(), "sent but not granted"
    assert SECURED - seen == set(), "granted for security but never sent"


async def test_a_coordinator_created_while_the_clusters_handler_goes_through_them() -> None:
    """Kopf's index of a cluster's TransactionCoordinators is live: a TransactionCoordinator
    created while the cluster's handler walks them (one certificate each, an await each)
    changed the collection under its loop (``RuntimeError: dictionary changed size during
    iteration``), and the handler failed, retried only after Kopf's minute of back-off. Held
    here at its read of the first coordinator's certificate while another one is made."""
    async with emulator() as emu, operator(emu, offline()):
        await secured(emu)
        await wait_until(lambda: all(emu.get(SECRETS, s) for s in ALL_SECRETS),
                         timeout=WAIT_S, what="the Secrets")  # fmt: skip
        held, release = asyncio.Event(), asyncio.Event()

        async def gate(request: kmock.Request) -> None:
            target = request.resource
            ours = target is not None and target.plural == "secrets"
            if ours and request.name == "demo-coordinator-tls" and not held.is_set():
                held.set()
                await release.wait()

        emu.gate = gate
        roles = {**ROLES, "audit-app": [{"resource": "acme/orders", "actions": ["consume"]}]}
        await emu.patch("SegtxnCluster", "demo", {"spec": {"security": {"roles": roles}}})
        await asyncio.wait_for(held.wait(), timeout=WAIT_S)
        await emu.create("TransactionCoordinator", "beta", {"clusterRef": "demo"})
        await wait_until(lambda: emu.get(SECRETS, "beta-coordinator-tls") is not None,
                         timeout=WAIT_S, what="beta indexed and its certificate made")  # fmt: skip
        release.set()
        await wait_until(
            lambda: (applied := condition_of(emu, "SegtxnCluster", "demo", "Applied")) is not None
            and applied.get("observedGeneration") == 2 and applied["status"] == "True",
            timeout=WAIT_S, what="the cluster's new spec applied",
        )  # fmt: skip
        assert emu.get(SECRETS, "demo-token-audit-app") is not None
