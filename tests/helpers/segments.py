"""Test helpers for segments: configs, and segment bytes read back from a journal."""

from __future__ import annotations

import pathlib
from typing import Any

from gateway.config import Config
from gateway.journal import replay_journal
from gateway.protocol.journal_pb2 import Operation


def make_config(data_dir: pathlib.Path, **sections: dict[str, Any]) -> Config:
    """A Config with data under ``data_dir`` and small, quickly rolling journal files."""
    doc: dict[str, dict[str, Any]] = {
        "node": {"data_dir": str(data_dir)},
        "journal": {
            "file_size": "1 MiB",
            "preallocate_step": "256 KiB",
            "max_operation_bytes": "1 MiB",
            "max_pending_bytes": "8 MiB",
            "checkpoint_every_frames": 50,
        },
        "container": {"max_append_bytes": "512 KiB"},
        "server": {"listen": "127.0.0.1:0", "max_message_bytes": "1 MiB"},
    }
    for name, values in sections.items():
        doc.setdefault(name, {}).update(values)
    return Config.from_dict(doc)


def journal_segments(journal_dir: pathlib.Path) -> dict[str, bytes]:
    """Each live segment's bytes, rebuilt from the journal alone (read-only).

    Only valid while the journal still holds all the data (no truncation of
    live data), which is true until Tier 2 exists. Bytes below a segment's
    truncation offset are returned as they were appended.
    """
    names: dict[int, str] = {}
    data: dict[int, bytearray] = {}

    def replay(seq: int, op: Operation) -> None:
        kind = op.WhichOneof("kind")
        if kind == "create_segment":
            names[op.create_segment.segment_id] = op.create_segment.name
            data[op.create_segment.segment_id] = bytearray()
        elif kind == "append":
            a = op.append
            buf = data[a.segment_id]
            assert a.offset == len(buf), f"append at {a.offset}, segment length {len(buf)}"
            buf += a.data
        elif kind == "delete_segment":
            names.pop(op.delete_segment.segment_id)

    replay_journal(journal_dir, replay)
    return {name: bytes(data[i]) for i, name in names.items()}
