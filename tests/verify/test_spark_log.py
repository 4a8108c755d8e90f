"""``spark_session(log=...)`` gives the JVM's stderr to a file: its start-up lines (and
whatever a Python runner it starts prints later) stay off the terminal. A process of its
own: the test session's JVM is already running, and only a starting JVM takes the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from segtxn.verify.spark import spark_session
spark = spark_session("local[1]", work_dir=Path(sys.argv[1]), log=Path(sys.argv[2]))
assert spark.range(3).count() == 3
spark.stop()
print("done", file=sys.stderr)
"""


def test_the_jvms_stderr_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "scratch"), str(log)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "done"  # this process's stderr is its own again
    assert "log level" in log.read_text()  # Spark's start-up lines went to the log
