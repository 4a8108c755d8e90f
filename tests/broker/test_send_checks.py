"""``check_send`` bounds a message's key and properties in UTF-8 bytes, not characters.

The entry that stores a message holds its key and properties encoded: a limit counted in
characters would let a key of multi-byte characters through at up to four times its bound.
The check skips encoding ASCII text (its length in characters is its length in bytes); these
tests hold it to the byte count on both sides of each bound, ASCII and not.
"""

from __future__ import annotations

import pytest

from segtxn.broker.arguments import check_send
from segtxn.protocol.errors import ErrorName, ServerError
from segtxn.protocol.frames import Send
from segtxn.protocol.limits import (
    MAX_MESSAGE_KEY_BYTES,
    MAX_MESSAGE_METADATA_BYTES,
    MAX_PROPERTIES,
)

LIMIT = 5 * 1024 * 1024
TWO_BYTES = "é"  # one character, two bytes in UTF-8
FOUR_BYTES = "\U0001f600"  # one character, four bytes


def refusal(send: Send) -> ErrorName | None:
    try:
        check_send(send, LIMIT)
    except ServerError as e:
        return e.name
    return None


def test_a_plain_send_passes() -> None:
    assert refusal(Send(seq=0, payload=b"x" * 100)) is None


@pytest.mark.parametrize("unit", ["k", TWO_BYTES, FOUR_BYTES])
def test_a_key_is_bounded_in_bytes(unit: str) -> None:
    size = len(unit.encode())
    at_limit = unit * (MAX_MESSAGE_KEY_BYTES // size)
    assert len(at_limit.encode()) == MAX_MESSAGE_KEY_BYTES
    assert refusal(Send(seq=1, payload=b"", key=at_limit)) is None
    over = at_limit + unit
    assert refusal(Send(seq=1, payload=b"", key=over)) is ErrorName.MESSAGE_TOO_LARGE


def test_a_key_of_multibyte_characters_within_the_character_count_is_refused() -> None:
    key = TWO_BYTES * (MAX_MESSAGE_KEY_BYTES // 2 + 1)  # fewer characters than the bound
    assert len(key) < MAX_MESSAGE_KEY_BYTES
    assert refusal(Send(seq=1, payload=b"", key=key)) is ErrorName.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("unit", ["v", TWO_BYTES, FOUR_BYTES])
def test_key_and_properties_are_bounded_together_in_bytes(unit: str) -> None:
    size = len(unit.encode())
    key = "k" * 100
    room = MAX_MESSAGE_METADATA_BYTES - len(key) - len("p")
    value = unit * (room // size)
    fits = Send(seq=2, payload=b"", key=key, properties={"p": value})
    assert len(key) + 1 + len(value.encode()) <= MAX_MESSAGE_METADATA_BYTES
    assert refusal(fits) is None
    over = Send(seq=2, payload=b"", key=key, properties={"p": value + unit * 2})
    assert refusal(over) is ErrorName.MESSAGE_TOO_LARGE


def test_property_names_count_in_bytes_too() -> None:
    name = TWO_BYTES * (MAX_MESSAGE_METADATA_BYTES // 2)  # exactly the bound, alone
    assert refusal(Send(seq=3, payload=b"", properties={name: ""})) is None
    assert (
        refusal(Send(seq=3, payload=b"", properties={name + TWO_BYTES: ""}))
        is ErrorName.MESSAGE_TOO_LARGE
    )


def test_too_many_properties_are_refused() -> None:
    many = {str(i): "" for i in range(MAX_PROPERTIES + 1)}
    assert refusal(Send(seq=4, payload=b"", properties=many)) is ErrorName.INVALID_MESSAGE
    assert refusal(Send(seq=4, payload=b"", properties=dict(list(many.items())[:-1]))) is None


def test_numbers_out_of_range_are_refused() -> None:
    assert refusal(Send(seq=-1, payload=b"")) is ErrorName.INVALID_MESSAGE
    assert refusal(Send(seq=0, payload=b"", event_time_ms=-1)) is ErrorName.INVALID_MESSAGE
    assert refusal(Send(seq=0, payload=b"", txn=(-1, 0))) is ErrorName.INVALID_MESSAGE
    assert refusal(Send(seq=0, payload=b"x" * (LIMIT + 1))) is ErrorName.MESSAGE_TOO_LARGE
