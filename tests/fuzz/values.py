"""What the HTTP fuzzing draws from: names, numbers, positions, bodies and transaction ids at
and past every limit (segtxn/protocol/limits.py), and plain garbage."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.conftest import GUARD_TENANT

T64, N64, L12 = "t" * 64, "n" * 64, "l" * 12  # 140 together: every name length at its limit
KNOWN_TOPICS = [
    "persistent/fz/ns/p1",
    "topic/fz/ns/s1",
    "segment/fz/ns/s1/0",
    "segment/fz/ns/s1/1",
    f"persistent/{T64}/{N64}/{L12}",
    f"topic/{T64}/{N64}/{L12}",
    f"segment/{T64}/{N64}/{L12}/0",
]
SUB64 = "s" * 64

PART = st.one_of(
    st.sampled_from(["fz", "ns", "p1", "s1", "fz2", "a.b", "x=y", "q-1_z"]),
    st.sampled_from([T64, N64, L12, "t" * 65, "l" * 128, "l" * 129, "=" * 21, "=" * 22, "a" * 141]),
    st.sampled_from(["", ".", "..", "...", "-x", "_x", "a b", "a/b", "caf\u00e9", "a\n", "%", "~"]),
    st.text(max_size=12),
).filter(lambda p: p != GUARD_TENANT)
SEGMENT_ID = st.sampled_from(["0", "1", "2", "99", "9" * 18, "9" * 19, "-1", "x", ""])
DOMAIN = st.sampled_from(["persistent", "topic", "segment"]) | st.sampled_from(["kafka", "", "x"])
SUBSCRIPTION = st.one_of(
    st.sampled_from([SUB64, "s1", "new-sub", "s" * 65, "a:b", ":" * 21, ":" * 22, "x" * 129]),
    st.sampled_from(["", "-x", "a b", "..", "caf\u00e9", "x\n"]),
    st.text(max_size=10),
)


LONG_PART = st.sampled_from([40, 64, 65, 100, 127, 128, 129]).map(lambda n: "w" * n) | (
    st.sampled_from([21, 22, 42, 43]).map(lambda n: "=" * n)
)


@st.composite
def topic_path(draw: st.DrawFn) -> list[str]:
    """A known topic, a name with long parts (around the length limits), or any name."""
    choice = draw(st.integers(0, 4))
    if choice < 2:
        return draw(st.sampled_from(KNOWN_TOPICS)).split("/")
    domain = draw(DOMAIN)
    part = LONG_PART if choice == 2 else PART
    parts = [domain, draw(part), draw(part), draw(part)]
    if domain == "segment" or draw(st.integers(0, 9)) == 0:
        parts.append(draw(SEGMENT_ID))
    return parts


NUMBER = st.sampled_from(
    [
        *("0", "1", "2", "-1", "255", "256", "257", "10000", "10001", "9" * 19, "9" * 40),
        *("1.5", "nan", "inf", "-inf", "1e400", "0x10", "\u00b2", "\u0663", "1_0", " 1", "", "+1"),
    ]
) | st.integers(-(2**70), 2**70).map(str)
POSITION = st.sampled_from(
    ["0:0", "1:0", "1:2", "-1:-1", "1:-5", "9" * 20 + ":0", "1:", ":1", "a:b", "1:2:3", "0x1:0"]
) | st.builds(lambda a, b: f"{a}:{b}", st.integers(-(2**64), 2**64), st.integers(-(2**64), 2**64))
WORD = st.sampled_from(
    ["earliest", "latest", "true", "false", "COMMIT", "ABORT", "commit", "v4", "v5", "Shared"]
)
ANY_VALUE = st.one_of(NUMBER, POSITION, WORD, st.text(max_size=30))


def query(**known: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, str]]:
    """The endpoint's own parameters (each maybe absent), sometimes a stray one."""
    return st.fixed_dictionaries(
        {}, optional={**known, "bogus": ANY_VALUE, **{k: ANY_VALUE for k in ("x", "limit")}}
    )


def _json_text(value: Any) -> bytes:
    return json.dumps(value).encode()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
PROPERTY_SETS = st.dictionaries(st.text(max_size=300), st.text(max_size=50), max_size=5) | (
    st.sampled_from(
        [
            {"": "v"},
            {"k" * 256: "v"},
            {"k" * 257: "v"},
            {"k": "v" * 8192},
            {"k": "v" * 8193},
            {f"k{i}": "v" for i in range(128)},
            {f"k{i}": "v" for i in range(129)},
            {f"k{i}": "v" * 8000 for i in range(9)},
            {"__contains_txn_messages": "true"},
            {"caf\u00e9": "\u00e9t\u00e9", "emoji": "\U0001f600"},
        ]
    )
)
EDGE_BODY = st.one_of(
    st.sampled_from(
        [
            b'{"k": "\\ud800"}',
            b'{"\\udfff": "v"}',
            b'{"k": "\\ud83d\\ude00"}',
            b'{"": "v"}',
            b"",
            b"null",
            b"{",
            b"\xff\xfe{}",
            b'{"k": NaN}',
            b'{"k": "v", "k": "w"}',
        ]
    ),
    st.sampled_from([31, 32, 33, 999, 1000, 5000, 100_000]).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from([31, 32, 33, 1000, 50_000]).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.just(b'{"k": "' + b"x" * (1 << 20) + b'"}'),  # over the request body limit
)
"""Bodies at and past each limit of a JSON body."""
BODY = st.one_of(
    PROPERTY_SETS.map(_json_text),
    EDGE_BODY,
    JSON.map(_json_text),
    st.binary(max_size=40),
)
TOPIC_STRING = topic_path().map(lambda p: p[0] + "://" + "/".join(p[1:])) | st.text(max_size=20)
ADD_BODY = st.one_of(
    st.fixed_dictionaries(
        {"topics": st.lists(TOPIC_STRING, max_size=4)},
        optional={"subscription": SUBSCRIPTION | st.integers() | st.none()},
    ).map(_json_text),
    st.sampled_from(
        [
            _json_text({"topics": ["topic://fz/ns/s1"] * 1001}),
            _json_text({"topics": [f"persistent://fz/ns/t{i}" for i in range(1000)]}),
            _json_text({"topics": "topic://fz/ns/s1"}),
            _json_text({"topics": [1, 2]}),
        ]
    ),
    BODY,
)


@st.composite
def txn_id(draw: st.DrawFn, known: list[str]) -> str:
    choice = draw(st.integers(0, 3))
    if choice == 0 and known:
        return draw(st.sampled_from(known))
    if choice == 1:
        most = draw(st.sampled_from([0, 1, 2**48, 2**48 + 1, 2**48 + 99, 2**64 - 1]))
        return f"{most:x}:{draw(st.integers(0, 2**64 - 1)):x}"
    if choice == 2:
        return draw(st.sampled_from(["", "1", ":", "g:1", "1:" + "f" * 17, "-1:1", "1:1:1"]))
    return draw(st.text(max_size=12))


METHOD = st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS"])
