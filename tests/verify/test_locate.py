"""Finding an anomaly's entries in a run's files: exact ids, not prefixes; a segment and a
position named apart; bounded places; long files cut short, and said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from segtxn.verify import locate as L

TXN = "1000000000003:11"
MESSAGE = "segment://verify/r/input/2@1:109"


def write(run_dir: Path, history: list[dict[str, object]], log: list[str]) -> None:
    (run_dir / "history").mkdir(parents=True)
    (run_dir / "history" / "p1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history))
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "standalone.log").write_text("".join(line + "\n" for line in log))


def test_ids_match_whole_tokens_and_segments_with_positions(tmp_path: Path) -> None:
    write(
        tmp_path,
        [
            {"kind": "begin", "txn": TXN},
            {"kind": "received", "id": MESSAGE},
            {"kind": "received", "id": "segment://verify/r/input/2@1:1090"},  # not it
            {"kind": "begin", "txn": TXN + "0"},  # not it either
        ],
        [
            f"INFO x: txn {TXN}: timed out, aborted by the sweep (age 3.1 s, timeout 3.0 s)",
            "INFO x: segment://verify/r/input/2/processors: rewound to 1:109, epoch 7",
            "INFO x: segment://verify/r/input/20/processors: rewound to 1:109",  # another one
            "INFO x: segment://verify/r/input/2/processors: rewound to 11:109",
        ],
    )
    found = L.locate(tmp_path, [TXN, MESSAGE, "segment://verify/r/out-a/0@1:5"])
    assert [str(p) for p in found.mentions[TXN].places] == [
        "history/p1.jsonl:1",
        "logs/standalone.log:1",
    ]
    assert [str(p) for p in found.mentions[MESSAGE].places] == [
        "history/p1.jsonl:2",
        "logs/standalone.log:2",
    ]
    assert found.mentions[MESSAGE].logs[0].text.endswith("rewound to 1:109, epoch 7")
    assert found.mentions["segment://verify/r/out-a/0@1:5"].total == 0
    assert not found.truncated


def test_places_are_bounded_and_long_files_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(L, "MAX_LINES", 50)
    write(tmp_path, [{"kind": "received", "id": MESSAGE}] * 10, [f"txn {TXN}: again"] * 80)
    found = L.locate(tmp_path, [MESSAGE, TXN])
    assert len(found.mentions[MESSAGE].history) == L.PLACES
    assert found.mentions[MESSAGE].total == 10
    assert len(found.mentions[TXN].logs) == L.PLACES
    assert found.mentions[TXN].total == 50  # the first 50 lines only
    assert found.truncated == ["logs/standalone.log"]
