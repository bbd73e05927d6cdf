"""Many segments at once, for scale tests and ``bench/scale.py --bulk``.

Creating a million segments through the protocol takes about an hour (one
conditional Tier-2 write per name claim). This installs them instead, as
``import-metadata`` would, on an empty node: one real chunk object in Tier 2
holds ``CHUNK`` bytes, and every segment is sealed and flushed with that
object as its only chunk (GC keeps an object any segment names; a read of
any segment returns those bytes). ``active`` segments are left unsealed and
empty, so appends can go on.

    python -m tests.helpers.bulk --config gateway.toml --data-dir DIR \
        --segments 1000000 [--stream big --members 100000] [--active 100]

Names: ``--members`` of them in the stream ``--stream`` (a real stream:
``<stream>/<12 digits>``), a tenth of the rest at the root (``r<7 digits>``),
the others under ``d<2 digits>/`` (100 directories).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import crc32c
import trio

from gateway.config import Config
from gateway.container.attributes import EVENT_COUNT
from gateway.container.streams import segment_name
from gateway.protocol.metadata_pb2 import (
    AttributeValue,
    ChunkRecord,
    ContainerSnapshot,
    SegmentRecord,
    StreamRecord,
)
from gateway.recovery.metadata_io import install
from gateway.storage import object_keys
from gateway.tier2.bindings import open_tier2

#: What the one chunk object holds: ten 100-byte lines.
CHUNK = (b"x" * 99 + b"\n") * 10


def names(segments: int, stream: str = "", members: int = 0) -> list[str]:
    """The segments' names (see the module docstring), stream members first."""
    out = [segment_name(stream, i + 1) for i in range(members)] if stream else []
    rest = segments - len(out)
    at_root = rest // 10
    out += [f"r{i:07d}" for i in range(at_root)]
    out += [f"d{i % 100:02d}/s{i:07d}" for i in range(rest - at_root)]
    return out


def container(
    all_names: list[str], chunk: ChunkRecord, active: int, stream: str = ""
) -> ContainerSnapshot:
    """Every name sealed with ``chunk`` as its data, but the last ``active`` ones empty."""
    now = int(time.time() * 1000)
    snap = ContainerSnapshot(version=1, next_segment_id=len(all_names) + 1)
    if stream:
        snap.streams.append(StreamRecord(name=stream, created_at_ms=now, next_number=0))
    events = CHUNK.count(b"\n")
    sealed = len(all_names) - active
    records = []
    for i, name in enumerate(all_names):
        if i < sealed:
            records.append(
                SegmentRecord(
                    id=i + 1,
                    name=name,
                    length=len(CHUNK),
                    storage_length=len(CHUNK),
                    sealed=True,
                    sealed_in_storage=True,
                    created_at_ms=now,
                    last_modified_ms=now,
                    attributes=[AttributeValue(id=EVENT_COUNT, value=events)],
                    chunks=[chunk],
                    event_index=[0],
                )
            )
        else:
            records.append(
                SegmentRecord(id=i + 1, name=name, created_at_ms=now, last_modified_ms=now)
            )
    snap.segments.extend(records)
    if stream:
        snap.streams[0].next_number = sum(1 for n in all_names if n.startswith(stream + "/")) + 1
    return snap


async def install_bulk(
    config: Config, segments: int, stream: str = "", members: int = 0, active: int = 0
) -> list[str]:
    """Install ``segments`` segments on the empty node ``config`` names; their names."""
    all_names = names(segments, stream, members)
    async with open_tier2(config) as tier2:
        key = object_keys.chunk_key(config.node.id, 1, 0, 1)
        await tier2.write(key, CHUNK, {})
    chunk = ChunkRecord(
        name=key, start_offset=0, length=len(CHUNK), crc32c=crc32c.crc32c(CHUNK), epoch=1
    )
    snap = container(all_names, chunk, active, stream)
    await install(config, snap, min_epoch=1)
    # As if every name had been claimed when it was created: a node that
    # imports metadata claims them all once in the background (one
    # conditional write each; gateway.daemon._maintain_claims), which a
    # measurement of the steady state should not include.
    marker = pathlib.Path(config.node.data_dir) / "cluster-claims"
    marker.write_text(config.tier2.url + "\n")
    return all_names


def main() -> None:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--segments", type=int, required=True)
    p.add_argument("--stream", default="")
    p.add_argument("--members", type=int, default=0)
    p.add_argument("--active", type=int, default=0)
    a = p.parse_args()
    config = Config.load(a.config)
    config = dataclasses.replace(
        config, node=dataclasses.replace(config.node, data_dir=str(pathlib.Path(a.data_dir)))
    )
    started = time.monotonic()
    trio.run(install_bulk, config, a.segments, a.stream, a.members, a.active)
    print(f"installed {a.segments} segment(s) in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
