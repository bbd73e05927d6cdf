"""The checked-in generated protobuf modules match the .proto files."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from .conftest import ROOT


def test_generated_modules_are_current(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    fresh = sorted((tmp_path / "gateway" / "protocol").glob("*_pb2.py*"))
    assert fresh, "protoc generated nothing"
    for new in fresh:
        checked_in = ROOT / "gateway" / "protocol" / new.name
        assert checked_in.exists(), f"{new.name} is not checked in: run `make proto`"
        assert checked_in.read_bytes() == new.read_bytes(), (
            f"{checked_in} is stale: run `make proto` and commit the result"
        )
    protos = sorted((ROOT / "gateway" / "protocol").glob("*.proto"))
    assert len(fresh) == 2 * len(protos)


def test_segment_info_has_the_wire_fields() -> None:
    """SegmentInfo.to_wire/from_wire map fields by name: the two must not drift apart."""
    import dataclasses

    from gateway.container.results import SegmentInfo
    from gateway.protocol import wire_pb2

    ours = [f.name for f in dataclasses.fields(SegmentInfo)]
    theirs = [f.name for f in wire_pb2.SegmentInfo.DESCRIPTOR.fields]
    assert sorted(ours) == sorted(theirs)
    info = SegmentInfo(*(range(1, len(ours) + 1)))  # type: ignore[arg-type]
    info = dataclasses.replace(info, name="a/b", sealed=True, sealed_in_storage=False)
    assert SegmentInfo.from_wire(info.to_wire()) == info
