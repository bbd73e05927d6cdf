"""``segment-gateway journal-dump``: print a journal's frames for operators.

Read-only and lock-free, so it also works on the journal of a running daemon
(it may then see a group that is still being written as a torn tail).
"""

from __future__ import annotations

import collections
import json
import pathlib
from typing import TextIO

from gateway.errors import JournalCorrupt
from gateway.journal.files import list_files
from gateway.journal.reader import (
    FileEnd,
    FrameRecord,
    mapped,
    read_frames,
    replay_journal,
    valid_frames_after,
)


def _describe_ops(record: FrameRecord) -> tuple[str, dict[str, int]]:
    try:
        ops = record.operations()
    except JournalCorrupt as e:
        return f"undecodable: {e.reason}", {}
    kinds = collections.Counter(op.WhichOneof("kind") or "unknown" for op in ops)
    return ",".join(f"{k}x{n}" for k, n in sorted(kinds.items())), dict(kinds)


def _write_frame(out: TextIO, record: FrameRecord, as_json: bool, note: str = "") -> None:
    h = record.header
    text, kinds = _describe_ops(record)
    if as_json:
        row = {
            "file": record.path.name, "offset": record.offset,
            "first_seq": h.first_sequence, "ops": h.operation_count,
            "group_seq": h.group_sequence, "epoch": h.epoch,
            "payload_bytes": h.payload_length, "crc": "ok", "kinds": kinds,
        }  # fmt: skip
        if note:
            row["note"] = note
        out.write(json.dumps(row) + "\n")
    else:
        out.write(
            f"{record.offset:>12} seq={h.first_sequence}..{h.end_sequence - 1} "
            f"group={h.group_sequence} epoch={h.epoch} "
            f"bytes={h.payload_length} crc=ok ops={text}{' ' + note if note else ''}\n"
        )


def dump(directory: pathlib.Path, out: TextIO, as_json: bool = False) -> int:
    """Print every frame and a verdict; return 0 if the journal would open cleanly, 3 if not."""
    for jf in list_files(directory):
        with mapped(jf.path) as data:
            if not as_json:
                out.write(f"# {jf.path.name} ({len(data)} bytes)\n")
            for item in read_frames(data, jf.path):
                if isinstance(item, FrameRecord):
                    _write_frame(out, item, as_json)
                elif isinstance(item, FileEnd) and not item.is_clean:
                    if as_json:
                        row = {"file": jf.path.name, "offset": item.offset, "bad": item.reason}
                        out.write(json.dumps(row) + "\n")
                    else:
                        out.write(f"{item.offset:>12} BAD FRAME: {item.reason}\n")
                    for later in valid_frames_after(data, item.offset + 1, jf.path):
                        _write_frame(out, later, as_json, "(after the bad frame)")
    try:
        result = replay_journal(directory, repair=False)
    except JournalCorrupt as e:
        verdict, code = f"CORRUPT: {e}", 3
    else:
        verdict = (
            f"ok: {result.frames} frames, {result.operations} operations, "
            f"next sequence {result.next_sequence}, last epoch {result.max_epoch}, "
            f"{len(result.checkpoints)} checkpoint(s)"
        )
        if result.torn is not None:
            verdict += (
                f"; torn tail at {result.torn.path.name} offset {result.torn.offset} "
                f"({result.torn.reason}) will be cut on next open"
            )
        code = 0
    if as_json:
        out.write(json.dumps({"verdict": verdict, "exit_code": code}) + "\n")
    else:
        out.write(verdict + "\n")
    return code
