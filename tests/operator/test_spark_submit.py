"""The driver's spark-submit command line, parsed by Spark's own argument parser.

pyspark ships Spark's jars; a py4j gateway to its JVM constructs
``org.apache.spark.deploy.SparkSubmitArguments`` from the rendered arguments (the parser
and validation ``spark-submit`` runs: an unknown option or a malformed ``--conf`` is refused
there) and runs ``SparkSubmit.prepareSubmitEnvironment`` on them, which resolves what
spark-submit would launch (the main class, the child's arguments, the Spark conf) without
launching it: nothing is submitted, no Kubernetes is needed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from segtxn.operator import sparkapp
from tests.operator.test_render import minimal

POD_IP = "10.244.0.17"


@pytest.fixture(scope="module")
def jvm() -> Iterator[Any]:
    """A Spark JVM: the one this process runs already, if any, or one of this module's own.

    One process must not hold two py4j gateways at once: their calls get mixed up (a method
    "does not exist", an object id of the other JVM). The verification tests' session lives
    for the whole run, and under pytest-xdist a worker may run them before this module."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    from segtxn.verify.spark import require_java

    running = SparkContext._gateway
    if running is not None:
        yield running.jvm
        return
    require_java()
    gateway = launch_gateway(SparkConf())  # type: ignore[no-untyped-call]  # pyspark's is untyped
    try:
        yield gateway.jvm
    finally:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its parent's pipe closes
        gateway.proc.wait(timeout=30)


def scala_seq(jvm: Any, items: list[str]) -> Any:
    array = jvm.java.util.ArrayList()
    for item in items:
        array.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(array).toSeq()


def java(jvm: Any, scala: Any) -> Any:
    return jvm.scala.jdk.javaapi.CollectionConverters.asJava(scala)


def parsed(jvm: Any, args: list[str]) -> Any:
    """``SparkSubmitArguments(args, sys.env)``: parsed and validated, or a Py4JJavaError."""
    cls = jvm.org.apache.spark.deploy.SparkSubmitArguments
    env = getattr(cls, "$lessinit$greater$default$2")()  # Scala's default: sys.env
    return cls(scala_seq(jvm, args), env)


def driver_args(**fields: Any) -> list[str]:
    """The driver container's command as the kubelet runs it ($(POD_IP) expanded)."""
    spec = minimal("VerificationRun", {"clusterRef": "demo", **fields})
    _, pod = sparkapp.render_run("r1", "segtxn", "u-1", spec, "http://demo-broker:8080")
    [driver] = pod["spec"]["containers"]
    assert driver["command"] == [sparkapp.SPARK_SUBMIT]
    env = {e["name"] for e in driver["env"]}
    assert "POD_IP" in env
    return [a.replace("$(POD_IP)", POD_IP) for a in driver["args"]]


def test_spark_parses_the_rendered_command_as_a_client_mode_k8s_python_app(jvm: Any) -> None:
    args = driver_args(executors={"instances": 2, "cores": 1, "memory": "1g"})
    submit = parsed(jvm, args)
    assert submit.master() == sparkapp.MASTER
    assert submit.deployMode() == "client"
    assert submit.name() == "r1"
    assert submit.isPython()
    assert submit.primaryResource() == f"file:{sparkapp.CHECK_SCRIPT}"
    assert submit.driverMemory() == "2g"
    assert list(java(jvm, submit.childArgs())) == sparkapp.check_args("r1")
    properties = java(jvm, submit.sparkProperties())
    expected = sparkapp.spark_conf(
        "r1", "segtxn", minimal("VerificationRun", {"clusterRef": "demo"})
    )
    expected["spark.driver.host"] = POD_IP
    assert {k: properties.get(k) for k in expected} == expected
    assert properties.get("spark.executor.instances") == "2"


def test_spark_prepares_the_submission_it_would_run(jvm: Any) -> None:
    submit = parsed(jvm, driver_args())
    spark_submit = jvm.org.apache.spark.deploy.SparkSubmit()
    prepared = spark_submit.prepareSubmitEnvironment(
        submit, getattr(spark_submit, "prepareSubmitEnvironment$default$2")()
    )
    child_args, conf, main_class = list(java(jvm, prepared._1())), prepared._3(), prepared._4()
    # Client mode: the Python app runs in this JVM's process (the pod), executors on k8s.
    assert main_class == "org.apache.spark.deploy.PythonRunner"
    assert conf.get("spark.master") == sparkapp.MASTER
    assert conf.get("spark.submit.deployMode") == "client"
    assert (
        conf.get("spark.kubernetes.executor.podTemplateFile") == "/etc/segtxn-spark/executor.yaml"
    )
    assert child_args[0] == f"file:{sparkapp.CHECK_SCRIPT}"
    assert child_args[2:] == sparkapp.check_args("r1")


@pytest.mark.parametrize(
    ("bad", "complaint"),
    [
        (["--no-such-option"], "Unrecognized option '--no-such-option'"),
        (["--conf", "no-equals-sign"], "Spark config without '='"),
        (["--deploy-mode", "sideways"], "--deploy-mode must be either"),
    ],
    ids=["unknown option", "conf without =", "bad deploy mode"],
)
def test_the_parser_is_strict(jvm: Any, bad: list[str], complaint: str) -> None:
    """The check above means something: the same parser refuses what spark-submit would."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]  # no type hints

    args = driver_args()
    with pytest.raises(Py4JJavaError) as refused:
        parsed(jvm, args[:4] + bad + args[4:])
    assert complaint in str(refused.value.java_exception)
