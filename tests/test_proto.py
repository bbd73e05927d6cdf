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
