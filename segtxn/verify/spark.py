"""A quiet Spark session for the checker, with the segtxn data source registered."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from segtxn.verify.source import SegtxnDataSource


def require_java() -> None:
    """Raises RuntimeError, saying what to install, when there is no Java runtime."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        raise RuntimeError(
            "Spark needs a Java 17+ runtime: install one (e.g. apt install "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )


def prepare_environment() -> None:
    """Set the variables Spark reads from this process's environment. :func:`spark_session`
    does it too; call it first in the main thread when the session starts in another thread
    while this one spawns processes (copying ``os.environ`` as it grows is a race)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def spark_session(
    master: str = "local[*]", *, work_dir: Path | None = None, log: Path | None = None
) -> SparkSession:
    """Spark in this process's Python (the data source's readers import segtxn), errors-only
    logging once started, no UI, scratch space under ``work_dir`` (default: a temporary
    directory). The JVM reads its environment once: the first session in a process decides.

    ``log``: where the JVM's stderr goes, if this call starts it (appended). It inherits
    this process's stderr otherwise, and so do the Python processes it starts: its start-up
    lines land on the terminal, and so does the traceback of a Python streaming-source
    runner that Spark starts for a query being stopped and then never answers (it gives
    up 15 s later, after the query, the session and a test run have ended). While the JVM
    starts, anything else this process writes to stderr goes to ``log`` too."""
    require_java()
    scratch = work_dir or Path(tempfile.mkdtemp(prefix="segtxn-spark-"))
    scratch.mkdir(parents=True, exist_ok=True)
    prepare_environment()
    builder = (
        SparkSession.builder.master(master)
        .appName("segtxn-verify")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
    )
    if log is None:
        spark = builder.getOrCreate()
    else:
        terminal = os.dup(2)
        try:
            with open(log, "ab") as f:
                os.dup2(f.fileno(), 2)
            spark = builder.getOrCreate()
        finally:
            os.dup2(terminal, 2)
            os.close(terminal)
    spark.sparkContext.setLogLevel("ERROR")  # the JVM's start-up lines still reach stderr
    spark.dataSource.register(SegtxnDataSource)
    return spark
