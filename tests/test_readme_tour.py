"""The README's five-minute tour works as written.

Every ``sh`` block after a ``<!-- tour -->`` marker runs, in order, in one
bash (``set -euo pipefail``) in a scratch directory laid out like the
repository (``.venv``, ``data``, ``mnt``), against a daemon started the way
``make run`` starts it. It runs in a network namespace of its own, so the
tour's fixed port 127.0.0.1:9410 is free whatever else runs here.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess

import pytest

from tests.helpers.mount import force_unmount, require_fuse

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent

PRELUDE = """
set -euo pipefail
ip link set lo up
.venv/bin/segment-gateway serve --data-dir "$PWD/data" --listen 127.0.0.1:9410 \\
    --mountpoint "$PWD/mnt" --ready-file "$PWD/ready" > daemon.log 2>&1 &
DAEMON=$!
for _ in $(seq 600); do [ -e ready ] && break; sleep 0.1; done
[ -e ready ] || { echo "daemon not ready"; cat daemon.log; exit 1; }
"""
EPILOGUE = """
kill -TERM $DAEMON
wait $DAEMON
echo "tour done"
"""


def tour_blocks(readme: str) -> list[str]:
    """The ``sh`` blocks that follow a ``<!-- tour -->`` marker."""
    return re.findall(r"<!-- tour -->\s*```sh\n(.*?)```", readme, flags=re.S)


@pytest.mark.timeout(400)
def test_readme_tour_runs_as_written(tmp_path: pathlib.Path) -> None:
    require_fuse()
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    blocks = tour_blocks((ROOT / "README.md").read_text())
    assert blocks, "README.md has no <!-- tour --> block"
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    script = tmp_path / "tour.sh"
    script.write_text(PRELUDE + "\n".join(blocks) + EPILOGUE)
    proc = subprocess.Popen(
        ["unshare", "--net", "bash", str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        force_unmount(tmp_path / "mnt")
    text = out.decode(errors="replace")
    log = (tmp_path / "daemon.log").read_text(errors="replace")[-3000:]
    assert proc.returncode == 0, f"tour failed:\n{text[-4000:]}\n--- daemon log ---\n{log}"
    assert "tour done" in text
    assert "stored up to event 10000" in text
    assert re.search(r"^10002 mnt/demo/clicks/0$", text, flags=re.M), text
    assert '{"key":"cy","ts":1700000100,"page":"/"}' in text  # what tail -f showed
    assert "refused, as it should be" in text and "Read-only file system" in text
    assert "refused: sealed (exit 12)" in text
    assert 'user.segment.sealed="0"' in text
    assert 'user.segment.storage_length="588895"' in text
    assert re.search(r"events_per_minute: \d+ row\(s\) written to out/epm", text), text
    assert "'key': 'ann'" in text and "'events': 1" in text
