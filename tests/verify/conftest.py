"""One Spark session (local[2]) for every verification test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from segtxn.verify.spark import spark_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    scratch = tmp_path_factory.mktemp("spark")
    session = spark_session("local[2]", work_dir=scratch, log=scratch / "spark.log")
    try:
        yield session
    finally:
        session.stop()
