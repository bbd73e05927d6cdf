"""Mounted segments read by the tools people point at files: pandas, pyarrow, DuckDB, Spark.

A truncated segment reads as zeros below its start offset in the plain view
(offsets kept), which JSON readers reject; the ``.trimmed`` view starts at
the first event at or after the start offset, and every reader takes it. An
active ``lines`` segment whose last raw append cut a line shows ending at
its last newline, so Spark's JSON reader sees no ``_corrupt_record`` while
it grows. One mounted daemon for the module; Spark runs ``local[2]``.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.client.sync import SyncClient
from tests.helpers.daemon import run_cli
from tests.helpers.mount import MountedDaemon, mounted_daemon
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def event(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"event {i}"}).encode() + b"\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountedDaemon]:
    tmp = tmp_path_factory.mktemp("parseable")
    with mounted_daemon(tmp, f'[tier2]\nurl = "file://{tmp}/tier2"\n') as daemon:
        yield daemon


@pytest.fixture(scope="module")
def truncated(gateway: MountedDaemon) -> tuple[str, int]:
    """A lines segment of events 0-99 truncated in the middle of event 10: (name, first id)."""
    d = gateway
    data = b"".join(event(i) for i in range(100))
    cut = len(b"".join(event(i) for i in range(10))) + 5
    with SyncClient(d.address) as c:
        c.create("cut/log", codec="lines")
        for k in range(0, len(data), 700):  # raw appends that cut lines
            c.append("cut/log", data[k : k + 700])
        c.truncate("cut/log", cut)
        c.seal("cut/log")
    return "cut/log", 11


def test_the_plain_view_keeps_offsets_and_trips_json_readers(
    gateway: MountedDaemon, truncated: tuple[str, int]
) -> None:
    import pandas as pd

    name, _ = truncated
    plain = gateway.mnt / name
    assert plain.read_bytes()[:5] == b"\0" * 5  # zeros below the start offset
    with pytest.raises(ValueError):
        pd.read_json(plain, lines=True)


def test_pandas_pyarrow_and_duckdb_read_the_trimmed_view(
    gateway: MountedDaemon, truncated: tuple[str, int]
) -> None:
    import pandas as pd
    import pyarrow.json as pj

    name, first = truncated
    trimmed = gateway.mnt / ".trimmed" / name
    expected = list(range(first, 100))
    assert list(pd.read_json(trimmed, lines=True)["id"]) == expected
    assert pj.read_json(trimmed).column("id").to_pylist() == expected
    # The offset mapping: the file's byte 0 is this segment offset.
    view_offset = int(os.getxattr(trimmed, "user.segment.view_offset"))
    assert view_offset == len(b"".join(event(i) for i in range(first)))
    assert (gateway.mnt / name).read_bytes()[view_offset:] == trimmed.read_bytes()
    # Not listed: `ls` and Spark's listings of the root do not see it.
    assert ".trimmed" not in os.listdir(gateway.mnt)
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(f"SELECT id FROM read_json_auto('{trimmed}') ORDER BY id").fetchall()
    assert [r[0] for r in rows] == expected


def test_a_truncation_at_an_event_boundary_keeps_that_event(gateway: MountedDaemon) -> None:
    import pyarrow.json as pj

    d = gateway
    with SyncClient(d.address) as c:
        c.create("exact", codec="lines")
        for i in range(20):
            c.append("exact", event(i))
        c.truncate("exact", len(b"".join(event(i) for i in range(5))))
    got = pj.read_json(d.mnt / ".trimmed" / "exact").column("id").to_pylist()
    assert got == list(range(5, 20))


def test_a_framed_segment_trimmed_starts_at_a_frame(gateway: MountedDaemon) -> None:
    d = gateway
    frames = [struct.pack(">I", 8) + b"frame-%02d" % i for i in range(10)]
    with SyncClient(d.address) as c:
        c.create("framed", codec="framed")
        for f in frames:
            c.append("framed", f)
        c.truncate("framed", 3 * 12 + 5)  # inside the fourth frame
    assert (d.mnt / ".trimmed" / "framed").read_bytes() == b"".join(frames[4:])


def test_spark_reads_the_trimmed_view_and_a_growing_file_without_corrupt_records(
    gateway: MountedDaemon, truncated: tuple[str, int], spark: Any
) -> None:
    d = gateway
    name, first = truncated
    df = spark.read.json(f"file://{d.mnt}/.trimmed/{name}")
    assert "_corrupt_record" not in df.columns
    assert sorted(r.id for r in df.collect()) == list(range(first, 100))
    # An active lines segment whose last raw append cut a line.
    with SyncClient(d.address) as c:
        c.create("growing", codec="lines")
        c.append("growing", event(1) + event(2) + event(3)[:9])
        assert c.info("growing").length == len(event(1) + event(2)) + 9
    assert (d.mnt / "growing").stat().st_size == len(event(1) + event(2))
    df = spark.read.json(f"file://{d.mnt}/growing")
    assert "_corrupt_record" not in df.columns
    assert sorted(r.id for r in df.collect()) == [1, 2]
    with SyncClient(d.address) as c:
        c.append("growing", event(3)[9:])
    # The kernel may keep the old size for fuse.active_timeout (1 s).
    whole = len(event(1) + event(2) + event(3))
    wait_for(lambda: (d.mnt / "growing").stat().st_size >= whole, 10, "the grown size")
    df = spark.read.json(f"file://{d.mnt}/growing")
    assert sorted(r.id for r in df.collect()) == [1, 2, 3]


def test_a_raw_segment_shows_its_whole_length(gateway: MountedDaemon) -> None:
    """Without a codec the gateway cannot tell where lines end: raw appends show as they are."""
    d = gateway
    with SyncClient(d.address) as c:
        c.create("rawcut")
        c.append("rawcut", b'{"id": 1}\n{"id"')
    assert (d.mnt / "rawcut").read_bytes() == b'{"id": 1}\n{"id"'
    assert os.getxattr(d.mnt / "rawcut", "user.segment.codec") == b"raw"


def test_a_raw_segment_truncated_inside_its_one_append_keeps_every_byte(
    gateway: MountedDaemon,
) -> None:
    """Raw: no boundary is known inside an append, so ``.trimmed`` starts at the start offset.

    One append of 100 JSON lines (``append --raw`` of a file, a writer's one
    block), truncated inside line 10: ``.trimmed`` has every byte the plain
    file still has, so parsers report the cut line instead of reading no
    rows; truncated at a line start, they read exactly the lines from there.
    """
    import pandas as pd
    import pyarrow.json as pj

    d = gateway
    data = b"".join(event(i) for i in range(100))
    cut = len(b"".join(event(i) for i in range(10))) + 5
    with SyncClient(d.address) as c:
        c.create("raw/block")
        c.append("raw/block", data)
        c.truncate("raw/block", cut)
    trimmed = d.mnt / ".trimmed" / "raw" / "block"
    assert int(os.getxattr(trimmed, "user.segment.view_offset")) == cut
    assert trimmed.stat().st_size == len(data) - cut
    assert trimmed.read_bytes() == data[cut:]
    with pytest.raises(ValueError, match="Expected object or value"):
        pd.read_json(trimmed, lines=True)  # the cut line is an error, never 0 rows
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(
        f"SELECT id FROM read_json_auto('{trimmed}', format='newline_delimited', "
        "ignore_errors=true) WHERE id IS NOT NULL ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == list(range(11, 100))
    # Truncated at a line start inside the same append: exactly the lines from there.
    start = len(b"".join(event(i) for i in range(20)))
    with SyncClient(d.address) as c:
        c.truncate("raw/block", start)
        c.seal("raw/block")
    assert int(os.getxattr(trimmed, "user.segment.view_offset")) == start
    assert list(pd.read_json(trimmed, lines=True)["id"]) == list(range(20, 100))
    assert pj.read_json(trimmed).column("id").to_pylist() == list(range(20, 100))
    rows = duckdb.sql(f"SELECT id FROM read_json_auto('{trimmed}') ORDER BY id").fetchall()
    assert [r[0] for r in rows] == list(range(20, 100))


def test_a_stream_directory_is_there_from_create_to_delete(gateway: MountedDaemon) -> None:
    """Readers started before the first append (a glob, Spark's readStream) find the stream."""
    d = gateway
    r = run_cli("stream", "create", "early/clicks", "--connect", d.address)
    assert r.returncode == 0, r.stderr
    stream = d.mnt / "early" / "clicks"
    assert stream.is_dir() and os.listdir(stream) == []
    assert glob.glob(f"{stream}/*") == []
    assert (d.mnt / ".trimmed" / "early" / "clicks").is_dir()
    with SyncClient(d.address) as c:
        landed = c.append("early/clicks", event(1)).segment
    assert os.listdir(stream) == [landed.rpartition("/")[2]]
    r = run_cli("stream", "delete", "early/clicks", "--connect", d.address)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not (d.mnt / "early").exists(), 5, "the stream's directory gone")
    assert "early" not in os.listdir(d.mnt)


def test_a_lines_stream_has_lines_segments_trimmed_at_a_line(gateway: MountedDaemon) -> None:
    """``stream create --codec lines``: every segment is ``lines``, so the gateway knows
    where its events end -- in an active segment's size and in ``.trimmed``."""
    import pandas as pd

    d = gateway
    r = run_cli("stream", "create", "logs/app", "--codec", "lines", "--connect", d.address)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["codec"] == "lines"
    assert os.listdir(d.mnt / "logs" / "app") == []
    data = b"".join(event(i) for i in range(100))
    with SyncClient(d.address) as c:
        # One raw append that ends inside a line.
        segment = c.append("logs/app", data + event(100)[:7]).segment
    plain = d.mnt / segment
    assert os.getxattr(plain, "user.segment.codec") == b"lines"
    assert plain.stat().st_size == len(data)  # an active lines segment ends at its last newline
    cut = len(b"".join(event(i) for i in range(30))) + 3
    with SyncClient(d.address) as c:
        c.truncate(segment, cut)
    trimmed = d.mnt / ".trimmed" / segment
    first_line = len(b"".join(event(i) for i in range(31)))
    assert int(os.getxattr(trimmed, "user.segment.view_offset")) == first_line
    assert trimmed.read_bytes() == data[first_line:]
    assert list(pd.read_json(trimmed, lines=True)["id"]) == list(range(31, 100))
    # Fixed at create: `stream set --codec` is refused, and says why.
    r = run_cli("stream", "set", "logs/app", "--codec", "raw", "--connect", d.address)
    assert r.returncode != 0 and "fixed" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("stream", "show", "logs/app", "--connect", d.address)
    assert json.loads(r.stdout)["codec"] == "lines"
    r = run_cli("stream", "delete", "logs/app", "--connect", d.address)
    assert r.returncode == 0, r.stderr
