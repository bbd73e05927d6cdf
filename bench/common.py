"""Helpers shared by the benchmarks: fio as the disk baseline, medians, the table."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile


def ensure_fio() -> str:
    """fio's path, installing Debian's package if it is missing."""
    path = shutil.which("fio")
    if path:
        return path
    print("bench: installing fio", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True, env=env)
    path = shutil.which("fio")
    if not path:
        raise SystemExit("fio is not available")
    return path


def run_fio(fio: str, directory: pathlib.Path, bs: str, size: str) -> dict[str, float]:
    """Sequential writes with fdatasync after each; bandwidth and IOPS."""
    work = pathlib.Path(tempfile.mkdtemp(dir=directory, prefix="fio-"))
    try:
        out = subprocess.run(
            [
                fio, "--name=seqwrite", f"--directory={work}", "--rw=write", f"--bs={bs}",
                f"--size={size}", "--fdatasync=1", "--ioengine=psync", "--output-format=json",
            ],
            check=True, capture_output=True, text=True, timeout=600,
        ).stdout  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    job = json.loads(out)["jobs"][0]["write"]
    return {"MBps": job["bw_bytes"] / 1e6, "iops": job["iops"]}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def replace_table(path: pathlib.Path, start_marker: str, end_marker: str, lines: list[str]) -> None:
    """Rewrite the text between two markers of a Markdown file (markers included in ``lines``)."""
    text = path.read_text()
    start, end = text.index(start_marker), text.index(end_marker) + len(end_marker)
    path.write_text(text[:start] + "\n".join(lines) + text[end:])
