"""The operator's own API client after its service-account token rotates: a 401 for the
old token makes it read the token file again and send the request once more with the new
one (segtxn/operator/kube.py); without a newer token the 401 is an error at once, not a
retry for ever. Against kmock's emulator, which refuses tokens it is not told to accept."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from segtxn.operator.kube import Kube, KubeError
from tests.operator.emulator import API, NS, emulator

pytestmark = pytest.mark.timeout(60)


async def test_a_rotated_token_is_read_again_after_a_401(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old\n")
    async with emulator() as emu:
        await emu.create("SegtxnCluster", "demo", {"metadataStore": {"url": "etcd://e:2379/v"}})
        info = kopf.ConnectionInfo(server=str(emu.url), insecure=True, token="old")
        kube = Kube(info, token_file=token_file)
        try:
            emu.tokens = frozenset({"old"})
            assert await kube.get(API, "SegtxnCluster", NS, "demo") is not None
            # The kubelet rotates the token; the API server soon refuses the old one.
            token_file.write_text("new\n")
            emu.tokens = frozenset({"new"})
            found = await kube.get(API, "SegtxnCluster", NS, "demo")
            assert found is not None and found["metadata"]["name"] == "demo"
            assert emu.unauthorized == ["Bearer old"]  # one refusal, then the new token
            assert await kube.get(API, "SegtxnCluster", NS, "demo") is not None
            assert emu.unauthorized == ["Bearer old"]  # kept for the next requests

            # Refused with the newest token there is: an error, not a loop.
            emu.tokens = frozenset({"newer"})
            with pytest.raises(KubeError) as refused:
                await kube.get(API, "SegtxnCluster", NS, "demo")
            assert refused.value.status == 401
            assert emu.unauthorized == ["Bearer old", "Bearer new"]
        finally:
            await kube.close()


async def test_without_a_token_file_a_401_is_an_error(tmp_path: Path) -> None:
    async with emulator() as emu:
        info = kopf.ConnectionInfo(server=str(emu.url), insecure=True, token="old")
        kube = Kube(info)  # a kubeconfig's credentials: nothing to read again
        try:
            emu.tokens = frozenset({"new"})
            with pytest.raises(KubeError) as refused:
                await kube.get(API, "SegtxnCluster", NS, "demo")
            assert refused.value.status == 401 and emu.unauthorized == ["Bearer old"]
        finally:
            await kube.close()
