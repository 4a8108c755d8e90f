"""``kill -USR1 <pid>``: any ``segtxn`` process writes every thread's and every asyncio task's
stack to its stderr, and goes on.

A process that hangs (a processor stuck inside a transaction, a broker that stops serving)
tells nothing in its log; its stacks do. The verification harness sends SIGUSR1 to every
process of a run that did not drain, and to a process that does not stop on SIGTERM, before
it kills it (:meth:`segtxn.verify.processes.ManagedProcess.dump_stacks`): the stacks land in
the run's ``logs/``. The dump ends with :data:`segtxn.verify.processes.DUMP_END`.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
import threading
from types import FrameType

from segtxn.verify.processes import DUMP_END


def install() -> None:
    if threading.current_thread() is threading.main_thread():  # signal handlers live there
        signal.signal(signal.SIGUSR1, _dump)


def _dump(_signum: int, _frame: FrameType | None) -> None:
    out = sys.stderr
    out.write("==== stacks (SIGUSR1): threads ====\n")
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        tasks = asyncio.all_tasks(loop)
        out.write(f"==== stacks (SIGUSR1): {len(tasks)} asyncio tasks ====\n")
        for task in sorted(tasks, key=lambda t: t.get_name()):
            out.write(f"-- task {task.get_name()}\n{_awaiting(task.get_coro())}")
    out.write(DUMP_END + "\n")
    out.flush()


def _awaiting(coro: object) -> str:
    """The chain of awaits from a task's coroutine down to what it waits on (a task's own
    stack shows only its outermost frame)."""
    lines = []
    for _ in range(100):  # a chain is short; a cycle is not ours to follow forever
        frame = next(
            (f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(coro, a, None))),
            None,
        )
        if frame is None:
            lines.append(f"    waiting on {coro!r}"[:300])
            break
        code = frame.f_code
        lines.append(f'    File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        coro = next(
            (c for a in ("cr_await", "gi_yieldfrom", "ag_await") if (c := getattr(coro, a, None))),
            None,
        )
        if coro is None:
            break
    return "\n".join(lines) + "\n"
