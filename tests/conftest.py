"""Suite-wide fixtures: a real etcd server for the session, a store on each backend, and a
guard against leaked tasks."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import segtxn
from segtxn.metastore import MetadataStore, open_store
from segtxn.metastore.etcd_server import AutoCompaction, EtcdServer
from segtxn.metastore.faults import FaultInjector
from tests.processes import ServerProcess

pytest_plugins = ["tests.cluster", "tests.fuzz.tally"]

# Every process the suite starts (servers, the CLI, processors, Spark's Python workers) runs
# the segtxn this process imports: the venv's scripts would import the tree the venv was
# installed from, which is another checkout when one venv serves two (a git worktree).
_TREE = str(Path(segtxn.__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_TREE, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _TREE)]
)

# ... and imports it. Where the environment says not to write bytecode
# (PYTHONDONTWRITEBYTECODE, set on this machine and in CI; or `python -B`), a fresh
# checkout has none: every one of them compiled every segtxn module from source again
# (0.2-0.6 s of CPU per process; the suite starts over a thousand: servers, CLI runs, soak
# and demo processes). They, and
# this process from here on, share one cache instead, outside the source tree
# (PYTHONPYCACHEPREFIX: the tree stays as clean as the setting asked). Python checks each
# cached file against its source's mtime and size and writes it atomically, so concurrent
# workers share it safely and an edited source is compiled again.
PYCACHE = Path(tempfile.gettempdir()) / f"segtxn-tests-pycache-{os.getuid()}"
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None or sys.dont_write_bytecode:
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the whole run (fsync off: tests measure behaviour, not disks).
    Each test isolates itself in its own key namespace."""
    server = EtcdServer.in_temp_dir(unsafe_no_fsync=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def compacting_etcd() -> Iterator[EtcdServer]:
    """A real etcd that compacts its own history every second (periodic mode, one second
    of retention), for tests of watches whose history is gone. Started on first use."""
    server = EtcdServer.in_temp_dir(
        unsafe_no_fsync=True, auto_compaction=AutoCompaction.periodic(1)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", "etcd"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MetadataStore]:
    """A store on each backend in turn: the in-process memory store, then a namespace of
    its own on the session's real etcd (named after the test file). Its engine is wrapped
    in a fault injector (:func:`faults`), which changes nothing until a test asks it to.
    Closed after the test.

    A directory or test file that needs another store (the memory backend only, a
    compacting or a small etcd, other settings) defines its own ``store``, which wins;
    one that wants this store on one backend only parametrizes it:
    ``@pytest.mark.parametrize("store", ["memory"], indirect=True)``."""
    if request.param == "memory":
        url = "memory://"
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"/{request.path.stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    opened = open_store(url, wrap=FaultInjector)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def faults(store: MetadataStore) -> FaultInjector:
    """The fault injector of the test's ``store`` (whichever ``store`` fixture it uses)."""
    engine = store.engine
    assert isinstance(engine, FaultInjector), "this store's engine has no fault injector"
    return engine


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """Server processes a test started (it appends them): each is stopped after the test,
    whatever happened, so none outlives it."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on its loop: every task needs an owner."""
    before = asyncio.all_tasks()
    yield
    leaked = {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()}
    if leaked:  # tasks that are winding down (gRPC tears calls down in its own tasks) may end
        _, leaked = await asyncio.wait(leaked, timeout=2.0)
    if not leaked:
        return
    names = sorted(f"{t.get_name()}: {_describe(t)}" for t in leaked)
    pytest.fail(f"{len(leaked)} task(s) leaked: {names}")


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return f"{getattr(coro, '__qualname__', None) or coro} {task.get_stack(limit=2)}"
