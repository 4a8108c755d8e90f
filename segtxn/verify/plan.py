"""A verification run's plan: the cluster's shape, the processors, the topology changes and the
faults, drawn from one seed.

The soak (:mod:`segtxn.verify.soak`) runs many seeds; a failing one must be reproducible, so
everything the harness chooses for a run comes from :func:`draw_plan` (a pure function of the
seed: same seed, same plan) and nothing else. What the product then does with its own timing
is not reproducible, which is why the run is checked rather than compared. Times are fractions
of the feed, so one plan fits any feed length. ``segtxn demo`` runs the fixed
:func:`demo_plan`.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

TOPICS = ("input", "out-a", "out-b")
"""The run's topics by role (:class:`segtxn.verify.processor.Topics`)."""


class Shape(enum.Enum):
    """How the run's cluster is laid out (:mod:`segtxn.verify.cluster` starts it)."""

    STANDALONE_MEMORY = "standalone-memory"
    """One ``segtxn standalone`` on the embedded store: nothing survives a restart."""
    STANDALONE_ETCD = "standalone-etcd"
    """One ``segtxn standalone`` on a private etcd with a data dir: survives a restart."""
    CLUSTER_ETCD = "cluster-etcd"
    """Brokers b1 and b2 and a coordinator, each its own process, on a private etcd."""
    CLUSTER_REPLICATED = "cluster-replicated"
    """Brokers b1, b2 and b3 with ledgers replicated 3/2 (and a short session, so a dead
    broker's topics are taken over), and a coordinator, on a private etcd."""

    @property
    def on_etcd(self) -> bool:
        return self is not Shape.STANDALONE_MEMORY

    @property
    def servers(self) -> tuple[str, ...]:
        """The server processes that a fault may kill and restart on their data."""
        if self is Shape.STANDALONE_MEMORY:
            return ()  # the embedded store forgets everything: a restart is a new cluster
        if self is Shape.STANDALONE_ETCD:
            return ("standalone",)
        return ("b1", "b2", "b3") if self is Shape.CLUSTER_REPLICATED else ("b1", "b2")

    @property
    def replicated(self) -> bool:
        return self is Shape.CLUSTER_REPLICATED

    @property
    def coordinated(self) -> bool:
        """Whether the transaction coordinator is a process of its own (``coordinator``),
        which a fault may kill or stop (in a standalone it is the standalone)."""
        return self in (Shape.CLUSTER_ETCD, Shape.CLUSTER_REPLICATED)


class FaultKind(enum.Enum):
    KILL_PROCESSOR = "kill-processor"
    """SIGKILL a processor inside a transaction, start it again under its name."""
    STOP_PROCESSOR = "stop-processor"
    """SIGSTOP a processor inside a transaction past its timeout, then SIGCONT: a zombie whose
    commit must be refused and whose segments must have moved on safely."""
    KILL_SERVER = "kill-server"
    """SIGKILL a broker (or the standalone, or the coordinator) just after a processor asked
    to commit, while END_TXN materializes (or is in flight); restart it on its data dir and
    port."""
    RESTART_ETCD = "restart-etcd"
    """Stop the private etcd and start it again on the same data dir and ports."""
    WIPE_SERVER = "wipe-server"
    """SIGKILL a broker of a replicated cluster as ``kill-server`` does, empty its data
    directory, and start it again: nothing it acknowledged may be lost."""
    STOP_SERVER = "stop-server"
    """SIGSTOP a broker of a replicated cluster just after a processor asked to commit, often
    past its session (its topics move to the others), then SIGCONT: an owner that wakes up
    with sends and acks in flight and must be fenced, not acknowledge what the new owner
    does not keep. Drawn by a generator of its own (:func:`draw_plan`). Also the
    coordinator of a cluster, past its session or not: it wakes up holding ids a new
    campaign may have taken, with END_TXN calls whose clients gave up on them."""

    def allowed(self, shape: Shape) -> bool:
        if self is FaultKind.KILL_SERVER:
            return bool(shape.servers)
        if self is FaultKind.RESTART_ETCD:
            return shape.on_etcd
        if self is FaultKind.WIPE_SERVER:
            return shape.replicated
        if self is FaultKind.STOP_SERVER:  # a broker of a replicated one; any coordinator
            return shape.coordinated
        return True


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at: float
    """When, as a fraction of the feed (the fault then waits for its moment: an open
    transaction, a commit)."""
    target: str
    """A processor (``p2``), a server (``b1``, ``standalone``) or ``etcd``."""
    hold_s: float = 0.0
    """How long the target stays stopped or down before it continues or restarts."""

    def describe(self) -> str:
        hold = f"/{self.hold_s:.1f}s" if self.hold_s else ""
        return f"{self.kind.value}:{self.target}@{self.at:.2f}{hold}"


@dataclass(frozen=True)
class TopologyChange:
    at: float
    """When, as a fraction of the feed."""
    topic: str
    """A role in :data:`TOPICS`."""
    op: str
    """``split`` (the widest active segment) or ``merge`` (the first two active segments)."""

    def describe(self) -> str:
        return f"{self.op}:{self.topic}@{self.at:.2f}"


@dataclass(frozen=True)
class RunPlan:
    seed: int
    shape: Shape
    processors: int
    topology: tuple[TopologyChange, ...]
    faults: tuple[Fault, ...]
    pipelined: bool = False
    """The processors pipeline their transactions (:mod:`segtxn.verify.processor`)."""

    @property
    def processing(self) -> str:
        """How the processors end their transactions: ``pipelined`` or ``sequential``."""
        return "pipelined" if self.pipelined else "sequential"

    def describe_faults(self) -> str:
        return " ".join(f.describe() for f in self.faults) or "none"

    def describe_topology(self) -> str:
        return " ".join(t.describe() for t in self.topology) or "none"


TXN_TIMEOUT_S = 3.0
"""The processors' transaction timeout (:class:`segtxn.verify.workload.WorkloadConfig`)."""
FIRST_SHAPES = (Shape.STANDALONE_MEMORY, Shape.STANDALONE_ETCD, Shape.CLUSTER_ETCD)
"""The shapes seeds were drawn from before replication: still drawn the same way."""
REPLICATED_SHARE = 0.25
"""About this share of seeds run on ``cluster-replicated``."""
REPLICATED_SESSION_TTL_S = 3.0
"""The brokers' session in a replicated cluster: a broker down longer loses its topics."""
STOP_SERVER_SHARE = 0.5
"""About this share of the ``cluster-replicated`` seeds get a ``stop-server`` fault."""
COORDINATOR_FAULT_SHARE = 0.5
"""About this share of the seeds on a cluster get a fault of its coordinator."""
PIPELINED_SHARE = 0.5
"""About this share of the seeds run their processors pipelined (each batch's transaction
ends while the next batch is worked on: ``client.transaction(after=...)``)."""
COORDINATOR_SESSION_TTL_S = REPLICATED_SESSION_TTL_S
"""The coordinator's session in a replicated cluster (a stopped one loses its ids past it;
on ``cluster-etcd`` it keeps the default 10 s, which no drawn stop outlasts)."""


def draw_plan(
    seed: int, *, txn_timeout_s: float = TXN_TIMEOUT_S, shape: Shape | None = None
) -> RunPlan:
    """The plan of the run with ``seed``: a pure function of its arguments.

    The shape is ``cluster-replicated`` for about a quarter of the seeds, else one of the
    first three (or ``shape``: the rest of the plan is drawn as for its seed; a seed's plan
    on the first three shapes is what it was before the replicated shape existed); 3 to 6
    processors (more than the 2 cores these machines
    have); 2 to 4 splits and merges of any topic, spread over the first 80% of the feed; 1 to
    3 faults, each of a kind the shape allows, one per slot of the feed (10%..85%, so each has
    time to act and the run time to recover before the feed ends); and on
    ``cluster-replicated``, for about half of the seeds (:data:`STOP_SERVER_SHARE`), one
    ``stop-server`` more, anywhere in that span; and on either cluster, for about half of
    the seeds (:data:`COORDINATOR_FAULT_SHARE`), a ``kill-server`` or ``stop-server`` of
    the coordinator for 0.5 to 7 s; and for about half of the seeds
    (:data:`PIPELINED_SHARE`), processors that pipeline their transactions.
    """
    rng = random.Random(seed)
    drawn = rng.choice(FIRST_SHAPES)
    if shape is None:  # (its own generator: the plans of the first shapes stay as they were)
        replicated = random.Random(f"{seed}/replicated").random() < REPLICATED_SHARE
        shape = Shape.CLUSTER_REPLICATED if replicated else drawn
    processors = rng.randint(3, 6)
    names = [f"p{i}" for i in range(1, processors + 1)]

    changes: list[TopologyChange] = []
    active = dict.fromkeys(TOPICS, 2)
    for at in sorted(rng.uniform(0.1, 0.8) for _ in range(rng.randint(2, 4))):
        topic = rng.choice(TOPICS)
        op = "merge" if active[topic] > 1 and rng.random() < 0.4 else "split"
        active[topic] += 1 if op == "split" else -1
        changes.append(TopologyChange(round(at, 3), topic, op))

    # stop-server came later: drawn below by its own generator, so the faults drawn here,
    # and the plans recorded before it, stay as they were
    kinds = [k for k in FaultKind if k.allowed(shape) and k is not FaultKind.STOP_SERVER]
    count = rng.randint(1, 3)
    slot = (0.85 - 0.1) / count
    faults: list[Fault] = []
    for i in range(count):
        kind = rng.choice(kinds)
        at = round(0.1 + slot * (i + rng.uniform(0.1, 0.9)), 3)
        if kind is FaultKind.KILL_PROCESSOR:
            fault = Fault(kind, at, rng.choice(names))
        elif kind is FaultKind.STOP_PROCESSOR:
            # past the timeout, and past the coordinator's sweep that aborts it
            fault = Fault(kind, at, rng.choice(names), round(txn_timeout_s + rng.uniform(1, 3), 1))
        elif kind in (FaultKind.KILL_SERVER, FaultKind.WIPE_SERVER):
            # in a replicated cluster, often down past its session: its topics move
            longest = 2 * REPLICATED_SESSION_TTL_S + 1 if shape.replicated else 2
            fault = Fault(kind, at, rng.choice(shape.servers), round(rng.uniform(0, longest), 1))
        else:
            fault = Fault(kind, at, "etcd", round(rng.uniform(0.5, 3), 1))
        faults.append(fault)
    stops = random.Random(f"{seed}/stop-server")
    if shape.replicated and stops.random() < STOP_SERVER_SHARE:
        # paused 1..7 s: mostly past its 3 s session (fenced, its topics moved), not always
        hold = round(stops.uniform(1, 2 * REPLICATED_SESSION_TTL_S + 1), 1)
        at = round(stops.uniform(0.1, 0.85), 3)
        faults.append(Fault(FaultKind.STOP_SERVER, at, stops.choice(shape.servers), hold))
    coordinator = random.Random(f"{seed}/coordinator")  # (came later still: its own too)
    if shape.coordinated and coordinator.random() < COORDINATOR_FAULT_SHARE:
        killed = coordinator.random() < 0.5  # else stopped
        hold = round(coordinator.uniform(0.5, 2 * COORDINATOR_SESSION_TTL_S + 1), 1)
        at = round(coordinator.uniform(0.1, 0.85), 3)
        how = FaultKind.KILL_SERVER if killed else FaultKind.STOP_SERVER
        faults.append(Fault(how, at, "coordinator", hold))
    faults.sort(key=lambda f: f.at)
    pipelined = random.Random(f"{seed}/pipelined").random() < PIPELINED_SHARE  # (its own too)
    return RunPlan(seed, shape, processors, tuple(changes), tuple(faults), pipelined)


DEMO_TOPOLOGY = (
    TopologyChange(0.2, "input", "split"),
    TopologyChange(0.35, "out-a", "split"),
    TopologyChange(0.5, "out-b", "merge"),
    TopologyChange(0.65, "input", "split"),
)


def demo_plan(seed: int, shape: Shape, processors: int) -> RunPlan:
    """``segtxn demo``'s fixed plan: split the input twice, split out-a, merge out-b, and
    SIGKILL p1 at 45% of the feed."""
    kill = Fault(FaultKind.KILL_PROCESSOR, 0.45, "p1")
    return RunPlan(seed, shape, processors, DEMO_TOPOLOGY, (kill,) if processors else ())
