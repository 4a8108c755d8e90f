"""Index-key encoding: byte order must equal tuple order, and encoding must round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segtxn.metastore import InvalidArgument, open_store
from segtxn.metastore import keys as K

components = st.one_of(
    st.integers(min_value=0, max_value=K.MAX_INT_COMPONENT),
    st.text(alphabet=st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=8),
)
index_keys = st.lists(components, max_size=4).map(tuple)


def _sort_key(key: tuple[str | int, ...]) -> tuple[tuple[int, object], ...]:
    # ints sort before strings (their tag 'i' < 's'); strings by UTF-8 bytes
    return tuple((0, c) if isinstance(c, int) else (1, c.encode()) for c in key)


@given(index_keys, index_keys)
def test_encoding_preserves_order(a: tuple[str | int, ...], b: tuple[str | int, ...]) -> None:
    ea, eb = K.encode_index_key(a), K.encode_index_key(b)
    assert (ea < eb) == (_sort_key(a) < _sort_key(b))
    assert (ea == eb) == (a == b)


@given(index_keys)
def test_encoding_round_trips(key: tuple[str | int, ...]) -> None:
    assert K.decode_index_key(K.encode_index_key(key)) == key


primaries = st.text(min_size=1, max_size=5).map(lambda s: "/" + s.replace("\x00", ""))


@given(index_keys, index_keys, primaries)
def test_prefix_bounds_select_exactly_the_extensions(
    prefix: tuple[str | int, ...], other: tuple[str | int, ...], primary: str
) -> None:
    lo, hi = K.index_bounds(b"ix", prefix, None)
    entry = K.index_entry_key(b"ix", K.encode_index_key(other), primary.encode())
    assert (lo <= entry < hi) == (other[: len(prefix)] == prefix)


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="known schemes"):
        open_store("zookeeper://localhost:2181")
    with pytest.raises(InvalidArgument):
        open_store("memory://somewhere/else")
