"""Crash safety: SIGKILL a real process that appends through the journal."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

from gateway.journal import replay_journal
from gateway.protocol.journal_pb2 import Operation
from tests.helpers.wait import wait_for

from .conftest import ROOT
from .helpers.journal_crasher import event_data

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

HELPER = ROOT / "tests" / "helpers" / "journal_crasher.py"
ROUNDS = 24


def read_acks(log: pathlib.Path) -> tuple[bool, list[tuple[int, int, int, int, int]]]:
    """(reached ready, acknowledged operations) from a crasher's log."""
    if not log.exists():
        return False, []
    text = log.read_text()
    lines = text.split("\n")
    complete = lines[:-1]  # the last element is "" or a line cut by the kill
    ready = "ready" in complete
    acks = []
    for line in complete:
        if line and line != "ready":
            seq, r, k, i, size = map(int, line.split())
            acks.append((seq, r, k, i, size))
    return ready, acks


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_loses_no_acknowledged_operation(tmp_path: pathlib.Path) -> None:
    journal_dir = tmp_path / "journal"
    rng = random.Random(os.environ.get("CRASH_SEED", "journal-crash"))
    acked: dict[int, tuple[int, int, int, int]] = {}
    killed_before_ready = 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for round_ in range(ROUNDS):
        log = tmp_path / f"acks-{round_}.log"
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), str(journal_dir), str(log), str(round_)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            if rng.random() < 0.2:
                # Somewhere in start-up: imports, recovery, the tail cut. The
                # pause is the test's subject: a crash at a random moment.
                time.sleep(rng.uniform(0.0, 1.0))
            else:

                def acking(proc: subprocess.Popen[bytes] = proc) -> bool:
                    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                    return bool(read_acks(log)[0])

                wait_for(acking, 60, "the crasher acknowledging", interval=0.005)
                # A random moment while it appends (the subject, as above).
                time.sleep(rng.uniform(0.0, 0.4))
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        ready, acks = read_acks(log)
        killed_before_ready += not ready
        for seq, r, k, i, size in acks:
            assert seq not in acked, f"sequence {seq} acknowledged twice"
            acked[seq] = (r, k, i, size)

        # The journal as recovery sees it after this kill.
        ops: dict[int, Operation] = {}
        seqs: list[int] = []

        def keep(seq: int, op: Operation) -> None:
            seqs.append(seq)
            ops[seq] = op

        replay_journal(journal_dir, keep)
        assert seqs == list(range(1, len(seqs) + 1)), f"round {round_}: gap in sequence numbers"
        for seq, (r, k, i, size) in acked.items():
            op = ops.get(seq)
            assert op is not None, f"round {round_}: acknowledged sequence {seq} is missing"
            assert op.WhichOneof("kind") == "append"
            assert op.append.segment_id == r * 1000 + k
            assert op.append.offset == i
            assert op.append.data == event_data(r, k, i, size), f"sequence {seq}: bytes differ"
    assert len(acked) > 1000, "too few acknowledged operations to mean anything"
    assert killed_before_ready < ROUNDS // 2
