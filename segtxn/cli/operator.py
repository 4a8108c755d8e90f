"""``segtxn operator``: the Kopf operator, leader-elected through Kopf peering."""

from __future__ import annotations

import secrets

import click


@click.command()
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
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
    "--liveness", default=None, help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
)
@click.option(
    "--broker-url",
    default=None,
    help="Reach every cluster's brokers here (an operator outside Kubernetes, a port-forward).",
)
@click.option("--coordinator-url", default=None, help="Likewise for the coordinators.")
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
) -> None:
    """Run the segtxn operator (Kopf) until interrupted."""
    try:
        import kopf

        from segtxn.operator import handlers
    except ImportError as e:  # the image installs it; a bare `pip install segtxn` does not
        raise click.ClickException(f"{e}: install segtxn[operator]") from e
    if namespaces and all_namespaces:
        raise click.UsageError("--namespace and --all-namespaces exclude each other")
    memo = kopf.Memo(
        config=handlers.OperatorConfig(broker_url=broker_url, coordinator_url=coordinator_url)
    )
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
