"""A writer process for the crash tests: it appends (or seals) and reports every
acknowledgment on stdout, one line each, flushed, until it is SIGKILLed.

Usage: python -m tests.ledger.crash_writer STORE_URL DATA_DIR NAME MODE SEED
MODE is "append" (16 concurrent appenders, forever) or "seal" (append a while, then
terminate, then keep trying to append).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
from pathlib import Path

from segtxn.ledger import FileLogStorage, LedgerSealed, LedgerSettings, ManagedLedger
from segtxn.metastore import open_store


def payload(writer: int, seq: int, rng: random.Random) -> bytes:
    body = f"{writer}:{seq}:".encode() + rng.randbytes(rng.randint(10, 3000))
    return body


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


async def main(url: str, data_dir: str, name: str, mode: str, seed: int) -> None:
    store = open_store(url)
    settings = LedgerSettings(max_ledger_bytes=64 * 1024, max_batch_bytes=32 * 1024)
    storage = FileLogStorage(Path(data_dir))
    ledger = await ManagedLedger.open(name, store, storage, settings)
    print("OPEN", flush=True)

    async def appender(writer: int) -> None:
        rng = random.Random(seed * 1000 + writer)
        seq = 0
        while True:
            data = payload(writer, seq, rng)
            try:
                position = await ledger.append(data)
            except LedgerSealed:
                print("REFUSED", flush=True)
                return
            print(f"ACK {position} {digest(data)}", flush=True)
            seq += 1

    writers = [asyncio.create_task(appender(i)) for i in range(16)]
    if mode == "seal":
        await asyncio.sleep(random.Random(seed).uniform(0.01, 0.2))  # sleep-ok: random seal time
        print("SEALING", flush=True)
        last = await ledger.terminate()
        print(f"SEALED {last}", flush=True)
    await asyncio.gather(*writers)
    await asyncio.Event().wait()  # wait to be killed


if __name__ == "__main__":
    url, data_dir, name, mode, seed = sys.argv[1:6]
    asyncio.run(main(url, data_dir, name, mode, int(seed)))
