"""``segtxn operator``: the Kopf operator, leader-elected through Kopf peering."""

from __future__ import annotations

import logging
import re
import secrets
import warnings

import click

from segtxn.cli import lifecycle, verbosity
from segtxn.cli.logs import log_format_option
from segtxn.cli.params import SECONDS, SECONDS_OR_ZERO, SERVICE_URL, HttpUrl

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _namespaces(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    for namespace in value:
        if not DNS_LABEL.fullmatch(namespace):
            raise click.BadParameter(
                f"{namespace!r} is not a Kubernetes namespace name (1-63 of a-z 0-9 -)"
            )
    return value


@click.command()
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    callback=_namespaces,
    help="Namespace to manage (repeatable). Without it: --all-namespaces.",
)
@click.option("-A", "--all-namespaces", is_flag=True, help="Manage every namespace.")
@click.option(
    "--peering",
    default="segtxn",
    show_default=True,
    help="Kopf peering name: replicas with the same one elect a single active operator.",
)
@click.option("--standalone", is_flag=True, help="No peering (a single operator replica).")
@click.option(
    "--priority",
    default=None,
    type=click.IntRange(1, 2**31 - 1),
    help="Peering priority: the highest live replica works, the others stand by. Default: "
    "random, so two replicas never tie (Kopf freezes every replica of equal priority).",
)
@click.option(
    "--liveness",
    default=None,
    type=HttpUrl(path_ok=True),
    help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
)
@click.option(
    "--broker-url",
    default=None,
    type=SERVICE_URL,
    help="Reach every cluster's brokers here (an operator outside Kubernetes, a port-forward).",
)
@click.option(
    "--coordinator-url",
    default=None,
    type=SERVICE_URL,
    help="Likewise for the coordinators.",
)
@click.option(
    "--api-timeout",
    default=15.0,
    show_default=True,
    type=SECONDS_OR_ZERO,
    metavar="SECONDS",
    help="At start-up, keep trying to reach the Kubernetes API this long, then exit 1 "
    "saying so (0: one attempt).",
)
@log_format_option
@click.option(
    "--roll-drain-timeout",
    default=300.0,
    show_default=True,
    type=SECONDS,
    metavar="SECONDS",
    envvar="SEGTXN_ROLL_DRAIN_TIMEOUT",
    show_envvar=True,
    help="A broker's drain (in a roll or before a scale-down) must empty it within this; "
    "else the roll stalls (or the scale-down is refused).",
)
@click.option(
    "--roll-evict-timeout",
    default=300.0,
    show_default=True,
    type=SECONDS,
    metavar="SECONDS",
    envvar="SEGTXN_ROLL_EVICT_TIMEOUT",
    show_envvar=True,
    help="A broker's pod whose eviction a PodDisruptionBudget refuses is tried again "
    "this long, then the roll stalls.",
)
@click.option(
    "--roll-ready-timeout",
    default=600.0,
    show_default=True,
    type=SECONDS,
    metavar="SECONDS",
    envvar="SEGTXN_ROLL_READY_TIMEOUT",
    show_envvar=True,
    help="A replaced broker's new pod must be Ready within this; else the roll stalls.",
)
@click.option(
    "--roll-retry",
    default=300.0,
    show_default=True,
    type=SECONDS,
    metavar="SECONDS",
    envvar="SEGTXN_ROLL_RETRY",
    show_envvar=True,
    help="A stalled roll is tried again after this (a new spec retries at once).",
)
@click.option(
    "--spark-service-account",
    "spark_service_accounts",
    multiple=True,
    metavar="NAME",
    help="A service account a VerificationRun's pods may run as (repeatable; never the "
    "operator's own). Default: segtxn-spark.",
)
@click.option(
    "--spark-image-prefix",
    "spark_image_prefixes",
    multiple=True,
    metavar="PREFIX",
    help="A VerificationRun's image must be under one of these (repeatable): 'segtxn' allows "
    "segtxn-verify:TAG, 'registry.example/team/' anything under that path. Default: segtxn.",
)
@click.option(
    "--own-service-account",
    default=None,
    metavar="NAME",
    envvar="SEGTXN_OPERATOR_SERVICE_ACCOUNT",
    show_envvar=True,
    help="The operator's own service account, which no VerificationRun may use (the chart "
    "sets it).",
)
def operator(
    *,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    peering: str,
    standalone: bool,
    priority: int | None,
    liveness: str | None,
    broker_url: str | None,
    coordinator_url: str | None,
    api_timeout: float,
    roll_drain_timeout: float,
    roll_evict_timeout: float,
    roll_ready_timeout: float,
    roll_retry: float,
    spark_service_accounts: tuple[str, ...],
    spark_image_prefixes: tuple[str, ...],
    own_service_account: str | None,
) -> None:
    """Run the segtxn operator (Kopf) until SIGTERM or SIGINT."""
    # until Kopf handles them itself; put back as they were when the command ends
    click.get_current_context().with_resource(lifecycle.catch_signals_early())
    try:
        import kopf

        from segtxn.operator import handlers
        from segtxn.operator.rollstate import RollSettings
        from segtxn.operator.sparkpolicy import (
            DEFAULT_IMAGE_PREFIX,
            DEFAULT_SERVICE_ACCOUNT,
            SparkPolicy,
        )
    except ImportError as e:  # the image installs it; a bare `pip install segtxn` does not
        raise click.ClickException(f"{e}: install segtxn[operator]") from e
    if namespaces and all_namespaces:
        raise click.UsageError("--namespace and --all-namespaces exclude each other")
    if "" in spark_image_prefixes:
        raise click.UsageError("--spark-image-prefix '': an empty prefix would allow every image")
    accounts = frozenset(spark_service_accounts or (DEFAULT_SERVICE_ACCOUNT,))
    if own_service_account in accounts:
        raise click.UsageError(
            f"--spark-service-account {own_service_account}: the operator's own service "
            "account; a VerificationRun would get the operator's rights"
        )
    spark = SparkPolicy(
        service_accounts=accounts,
        image_prefixes=spark_image_prefixes or (DEFAULT_IMAGE_PREFIX,),
        operator_service_account=own_service_account,
    )
    roll = RollSettings(
        drain_timeout_s=roll_drain_timeout,
        evict_timeout_s=roll_evict_timeout,
        ready_timeout_s=roll_ready_timeout,
        retry_s=roll_retry,
    )
    memo = kopf.Memo(
        config=handlers.OperatorConfig(
            broker_url=broker_url,
            coordinator_url=coordinator_url,
            api_timeout_s=api_timeout,
            roll=roll,
            namespaces=namespaces,
            spark=spark,
        )
    )
    _quiet_start_up_failures()
    try:
        kopf.run(
            standalone=standalone,
            peering_name=None if standalone else peering,
            priority=priority or secrets.randbelow(2**31 - 2) + 1,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
            memo=memo,
        )
    except (kopf.LoginError, kopf.PermanentError) as e:
        raise click.ClickException(str(e)) from e
    except Exception as e:  # Kopf's start-up failure wraps the handler's error
        cause = e.__cause__
        if isinstance(cause, kopf.PermanentError):
            raise click.ClickException(str(cause)) from e
        raise


def _quiet_start_up_failures() -> None:
    """A start-up that fails is said once, by the CLI's edge: without ``-v``, Kopf's own
    ERROR line for it, and the warning about a coroutine its failed start leaves behind,
    would say it again in other words."""
    if verbosity.configured() == 0:
        logging.getLogger("kopf.activities.startup").setLevel(logging.CRITICAL)
    warnings.filterwarnings(
        "ignore", message="coroutine 'authenticator' was never awaited", category=RuntimeWarning
    )
