"""Append through the journal until killed, logging every acknowledged operation.

Usage: journal_crasher.py JOURNAL_DIR ACK_LOG ROUND

Each acknowledgement is logged with one unbuffered write *after* append()
returned, so a line in the log means the operation was acknowledged. The
parent test SIGKILLs this process at random moments and checks the journal.
"""

from __future__ import annotations

import os
import random
import sys

import trio

from gateway.config import JournalConfig, KiB, MiB
from gateway.journal import open_journal
from gateway.journal.format import encode_append

WRITERS = 16
SIZES = [0, 1, 100, 1000, 5000, 30_000]


def event_data(round_: int, writer: int, index: int, size: int) -> bytes:
    """The bytes writer ``writer`` appends as its ``index``-th operation in ``round_``."""
    return random.Random(f"{round_}/{writer}/{index}").randbytes(size)


async def main(directory: str, ack_log: str, round_: int) -> None:
    cfg = JournalConfig(
        file_size=1 * MiB,
        preallocate_step=256 * KiB,
        max_frame_bytes=16 * KiB,
        max_group_bytes=128 * KiB,
        max_pending_bytes=4 * MiB,
        max_operation_bytes=512 * KiB,
    )
    log_fd = os.open(ack_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    async with open_journal(directory, cfg) as journal:
        os.write(log_fd, b"ready\n")

        async def writer(k: int) -> None:
            rng = random.Random(f"{round_}/{k}")
            for i in range(1_000_000):
                size = rng.choice(SIZES)
                data = event_data(round_, k, i, size)
                seq = await journal.append_parts(encode_append(round_ * 1000 + k, i, data))
                os.write(log_fd, f"{seq} {round_} {k} {i} {size}\n".encode())
                if rng.random() < 0.01:
                    await journal.checkpoint(f"checkpoint {round_}/{k}/{i}".encode())

        async with trio.open_nursery() as nursery:
            for k in range(WRITERS):
                nursery.start_soon(writer, k)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
