"""The benchmarks import each other as top-level modules (``from common import ...``): their
directory goes on ``sys.path`` for the tests of their helper modules."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
