"""The command line's parameter types: bad input is refused when it is parsed, as a usage
error that names the flag, before anything connects or starts.

Numbers use click's ``IntRange`` and :class:`FloatRange` (their bounds show in ``--help``); URLs,
store URLs and key hashes have the types below. Defined once, so that every command that
takes a port, a service URL or a count accepts exactly the same things.
"""

from __future__ import annotations

import ipaddress
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from segtxn.metastore import InvalidArgument, check_url
from segtxn.protocol.errors import ServerError
from segtxn.protocol.hashing import HASH_SPACE
from segtxn.protocol.limits import MAX_TENANT, parse_position
from segtxn.protocol.names import Domain, InvalidTopicName, TopicName, client_name_problem
from segtxn.verify.history import HistoryStore

F = TypeVar("F", bound=Callable[..., Any])


class FloatRange(click.FloatRange):
    """click's ``FloatRange`` that also refuses ``nan``: every comparison with nan is false,
    so a range let it through, and it then broke what used it (a shutdown's timer, a
    session's TTL: an internal error; a store timeout: a start-up that never gave up)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


PORT = click.IntRange(0, 65535)
"""A TCP port; 0 asks the system for a free one where the command allows it."""
POSITIVE_INT = click.IntRange(min=1)
COUNT = click.IntRange(min=0)
SECONDS = FloatRange(min=0, min_open=True, max=365 * 24 * 3600)
"""A duration that must pass (no zero, no negative, no inf or nan)."""
SECONDS_OR_ZERO = FloatRange(min=0, max=365 * 24 * 3600)
FRACTION = FloatRange(0, 1)


class HttpUrl(click.ParamType[str]):
    """``http(s)://host[:port]``: a service URL. ``path_ok`` also allows a path (an endpoint
    such as a liveness probe's); ``several`` allows a comma-separated list (the client tries
    them in turn)."""

    name = "URL"

    def __init__(self, *, path_ok: bool = False, several: bool = False) -> None:
        self.path_ok = path_ok
        self.several = several
        if several:
            self.name = "URL[,URL...]"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        items = str(value).split(",") if self.several else [str(value)]
        urls = [self._one(item.strip(), param, ctx) for item in items if item.strip()]
        if not urls:
            self.fail("no URL given", param, ctx)
        return ",".join(urls)

    def _one(self, text: str, param: click.Parameter | None, ctx: click.Context | None) -> str:
        form = "http://host:port" + ("/path" if self.path_ok else "")
        text = ipv6_bracketed(text)
        try:
            parts = urlsplit(text)
        except ValueError as e:  # (an unclosed IPv6 bracket)
            self.fail(f"{text!r} is not a URL of the form {form}: {e}", param, ctx)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.fail(f"{text!r} is not a URL of the form {form}", param, ctx)
        try:
            parts.port  # noqa: B018 (it raises ValueError for a bad port)
        except ValueError:
            self.fail(f"{text!r}: the port must be a number from 0 to 65535", param, ctx)
        if (parts.path not in ("", "/") and not self.path_ok) or parts.query or parts.fragment:
            self.fail(f"{text!r}: expected only {form}", param, ctx)
        return text if self.path_ok else text.rstrip("/")


def ipv6_bracketed(url: str) -> str:
    """``http://fd00::1:8081`` as ``http://[fd00::1]:8081``; any other text as given.

    Why: the operator advertises a coordinator as ``http://$(POD_IP):PORT``, and on an
    IPv6 cluster Kubernetes expands that to an address without the brackets a URL needs
    around it: the coordinator refused to start ("the port must be a number"). The last
    colon-separated part is taken as the port when it is decimal digits and what precedes
    it is an IPv6 address, which is what the expansion gives."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, _, port = netloc.rpartition(":")
    if not sep or "[" in netloc or "@" in netloc or ":" not in host or not port.isdigit():
        return url
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return url
    return f"{scheme}://[{host}]:{port}{slash}{path}"


class StoreUrl(click.ParamType[str]):
    """A metadata store URL (``memory://``, ``etcd://host:port[,...][/namespace]``), checked
    without connecting. ``extra`` are other accepted words (the demo's ``etcd-local``)."""

    name = "STORE"

    def __init__(self, *extra: str) -> None:
        self.extra = extra

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value).strip()
        if text in self.extra:
            return text
        try:
            check_url(text)
        except InvalidArgument as e:
            self.fail(str(e), param, ctx)
        return text


class KeyHash(click.ParamType[int]):
    """A point of the key-hash space, 0x0000-0xffff: hex (``0x4000``) or decimal."""

    name = "HASH"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            point = value
        else:
            try:
                point = int(str(value).strip(), 0)
            except ValueError:
                self.fail(f"{value!r} is not a hash: 0x0000-0xffff, in hex (0x...) or decimal")
        if not 0 <= point < HASH_SPACE:
            self.fail(f"{value!r} is outside the hash space 0x0000-0xffff", param, ctx)
        return point


class Topic(click.ParamType[str]):
    """A topic name (``persistent://``, ``topic://``, ``segment://``), parsed before
    anything connects; ``domains`` limits which are accepted."""

    name = "TOPIC"

    def __init__(self, *domains: Domain) -> None:
        self.domains = domains or tuple(Domain)

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        try:
            name = TopicName.parse(str(value))
        except InvalidTopicName as e:
            self.fail(str(e), param, ctx)
        if name.domain not in self.domains:
            wanted = " or ".join(f"{d.value}://" for d in self.domains)
            self.fail(f"{value!r}: this command takes a {wanted} topic", param, ctx)
        return str(value)


class Subscription(click.ParamType[str]):
    """A subscription's name, as the brokers accept it (1-64 of letters, digits, ``_.:=-``):
    refused before anything connects, and never one that would change the admin URL it is
    put in (a ``/`` or a ``?``)."""

    name = "SUBSCRIPTION"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        problem = client_name_problem("subscription", text)
        if problem is not None:
            self.fail(problem, param, ctx)
        return text


class LedgerEntry(click.ParamType[str]):
    """``LEDGER:ENTRY``: a message's position in a ``persistent://`` topic or a segment, two
    numbers in 0..2^63-1 as the brokers take them. Kept as text (the broker reads it again);
    a message id as ``consume --print`` shows it (``TOPIC@LEDGER:ENTRY``) is refused with
    a hint rather than taken: its topic could be another one's."""

    name = "LEDGER:ENTRY"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        try:
            ledger, entry = parse_position(text, "LEDGER:ENTRY")
        except ServerError:
            hint = (
                "of a message id TOPIC@LEDGER:ENTRY, give the part after '@'"
                if "@" in text
                else "two numbers from 0, as 3:17"
            )
            shown = text if len(text) <= 60 else text[:60] + "..."
            self.fail(f"{shown!r} is not LEDGER:ENTRY ({hint})", param, ctx)
        return f"{ledger}:{entry}"


class BrokerId(click.ParamType[str]):
    """A broker's id, as ``segtxn broker --broker-id`` accepts it (1-63 of letters, digits,
    ``_.-``): a typo is refused before anything connects."""

    name = "BROKER"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        from segtxn.broker.settings import BROKER_ID  # here: it imports the broker's auth

        text = str(value)
        if not BROKER_ID.fullmatch(text):
            self.fail(f"{text!r} is not a broker id (1-63 of letters, digits, _.-)", param, ctx)
        return text


class Namespace(click.ParamType[tuple[str, str]]):
    """``tenant/namespace``."""

    name = "TENANT/NAMESPACE"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        text = str(value)
        try:
            name = TopicName.parse(f"persistent://{text}/x")
        except InvalidTopicName:
            self.fail(f"{text!r} is not tenant/namespace (each 1-{MAX_TENANT} of A-Z a-z 0-9 -_.=)")
        return name.tenant, name.namespace


SUBSCRIPTION = Subscription()
SERVICE_URL = HttpUrl()
SERVICE_URLS = HttpUrl(several=True)
"""What ``--url`` takes: one broker's URL, or several separated by commas."""
STORE_URL = StoreUrl()


def data_dir_option(*, required: bool, help: str) -> Callable[[F], F]:
    """``--data-dir``: a directory a server keeps its files in (see :func:`prepare_data_dir`).
    It has no ``default``: since click 8.3 an explicit ``default=None`` counts as a value, so
    a required option left out was not reported (the command failed later, internally)."""
    return click.option(
        "--data-dir",
        required=required,
        type=click.Path(file_okay=False, path_type=Path),
        help=help,
    )


def prepare_data_dir(path: Path) -> Path:
    """Create ``path`` if missing and prove it can be written (a file made and removed): a
    server must not start and then fail on its first write. Returns it resolved.

    Raises:
        click.BadParameter: it cannot be created or written; says why.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise click.BadParameter(
            f"{path} cannot be used: {e.strerror or e}", param_hint="'--data-dir'"
        ) from e
    return path.resolve()


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave option ``name`` (on the command line or from its env var),
    rather than it taking its default."""
    source = ctx.get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def refuse_unless(ctx: click.Context, name: str, applies: bool, why: str) -> None:
    """Refuse option ``name`` (a usage error) when given where it does not apply."""
    if given(ctx, name) and not applies:
        flag = "--" + name.replace("_", "-")
        raise click.UsageError(f"{flag} does not apply here: {why}", ctx)


HISTORY = click.Choice([s.value for s in HistoryStore])


def history_option(default: HistoryStore) -> Callable[[F], F]:
    """``--history files|topics``: where the clients record their histories."""
    return click.option(
        "--history",
        default=default.value,
        show_default=True,
        type=HISTORY,
        help="Where every client records its history: files in the run directory, or the "
        "run's history topic (topic://verify/RUN/history), which the checker reads through "
        "the segtxn data source.",
    )
