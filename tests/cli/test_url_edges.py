"""IPv6 in URL flags: one with an unclosed bracket is a usage error (exit 2, before anything
starts), not an internal error (click's CliRunner, the real entry point; it failed before
its fix, a review); an address without brackets before its port is taken bracketed."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main
from segtxn.cli.params import HttpUrl

BAD_URLS = [
    (["topics", "list", "a/b", "--url", "http://[::1"], "--url"),
    (["produce", "topic://a/b/c", "--url", "http://[::1:8080"], "--url"),
    (["store", "defrag", "--store", "etcd://[::1"], "--store"),
    (["standalone", "--store", "etcd://[::1:2379/ns", "--port", "0"], "--store"),
    (
        [
            "broker",
            "--store",
            "memory://",
            "--data-dir",
            "d",
            "--advertise",
            "http://[::1",
            "--broker-id",
            "b",
        ],
        "--advertise",
    ),
]


@pytest.mark.parametrize(("args", "option"), BAD_URLS, ids=[" ".join(a[:2]) for a, _ in BAD_URLS])
def test_a_url_with_an_unclosed_ipv6_bracket_is_a_usage_error(args: list[str], option: str) -> None:
    """README: "a malformed URL ... [is a] usage error (exit 2) before anything starts".
    urlsplit raises ValueError ("Invalid IPv6 URL") outside the parameter types' checks
    (cli/params.py HttpUrl._one, and check_url behind StoreUrl), so these end as
    "internal error: ValueError", exit 1."""
    result = CliRunner().invoke(main, args)
    assert "internal error" not in result.stderr, result.stderr
    assert result.exit_code == 2, result.stderr
    assert option in result.stderr


@pytest.mark.parametrize(
    ("given", "taken"),
    [
        ("http://fd00::1:8081", "http://[fd00::1]:8081"),  # $(POD_IP) on an IPv6 cluster
        ("https://::1:8443/", "https://[::1]:8443"),
        ("http://[fd00::1]:8081", "http://[fd00::1]:8081"),
        ("http://10.0.0.7:8081", "http://10.0.0.7:8081"),
        ("http://coordinator-0:8081", "http://coordinator-0:8081"),
    ],
)
def test_an_ipv6_address_without_brackets_before_its_port_is_taken_bracketed(
    given: str, taken: str
) -> None:
    """The operator advertises a coordinator as ``http://$(POD_IP):PORT``; on an IPv6
    cluster that expands without the brackets a URL needs, and the coordinator refused to
    start ("the port must be a number from 0 to 65535")."""
    assert HttpUrl().convert(given, None, None) == taken


def test_an_ipv6_address_without_a_port_is_still_refused() -> None:
    with pytest.raises(click.BadParameter, match="port must be a number"):
        HttpUrl().convert("http://fd00::1:x", None, None)
