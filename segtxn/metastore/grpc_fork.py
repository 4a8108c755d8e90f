"""gRPC's fork handlers turned off before anything imports ``grpc``: a segtxn process forks
only to ``exec`` at once, and a child that execs has no use for them.

Why: gRPC (1.85) installs ``pthread_atfork`` handlers that clean its state up in a forked
child. When a process forked while another of its threads was in a call on the etcd
channel, gRPC skipped them ("Other threads are currently calling into gRPC, skipping fork()
handlers") and the child crashed with SIGSEGV before its ``exec``: 31 to 44 of 300 forks,
with a store writing in another thread. A fork is what ``subprocess`` does when given a
``preexec_fn``, as PySpark is when it starts its JVM: the JVM then "exited before sending its
port number", which failed a test run's every Spark test in one worker, and would fail
``segtxn verify`` on an etcd store the same way. With the handlers off no child crashed in
300. gRPC reads the setting when it is imported, so this module sets it in the environment
(which children inherit, harmlessly) and :mod:`segtxn.metastore` imports it first. A value
already in the environment is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
