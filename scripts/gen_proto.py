#!/usr/bin/env python3
"""Regenerate the checked-in protobuf modules (``make proto``).

With ``--out DIR`` the modules are written under DIR instead of in place; the
staleness test uses that to compare a fresh generation with the checked-in
files.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "gateway" / "protocol"


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    """Generate ``*_pb2.py`` and ``*_pb2.pyi`` for every .proto under out."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        *(str(p.relative_to(ROOT)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return protos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    args = parser.parse_args()
    protos = generate(args.out)
    print(f"generated {len(protos)} proto file(s) under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
