"""One Spark session (local[2]) for every verification test, and a longer time limit for
the tests that use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from segtxn.verify.spark import spark_session

SPARK_TEST_TIMEOUT_S = 600
"""The time limit of a test that uses the shared session, in place of the suite's 120 s.
pytest-timeout interrupts a test where it is: inside a py4j call, it leaves the gateway's
socket with an answer unread, and every later Spark call in the process reads the answer
to an earlier one. On a loaded machine one checker test went past 120 s, and eight more in
its worker then failed ("SparkSession does not exist in the JVM", ``KeyError: 'c'``,
"Method clearCache([]) does not exist"). A hung test is still stopped, later."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_spark = "spark" in getattr(item, "fixturenames", ())
        if uses_spark and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    scratch = tmp_path_factory.mktemp("spark")
    session = spark_session("local[2]", work_dir=scratch, log=scratch / "spark.log")
    try:
        yield session
    finally:
        session.stop()
