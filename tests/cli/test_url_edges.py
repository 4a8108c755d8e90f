"""A URL flag with an unclosed IPv6 bracket is a usage error (exit 2, before anything
starts), not an internal error (click's CliRunner, the real entry point). It failed before
its fix (a review)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from segtxn.cli.commands import main

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
