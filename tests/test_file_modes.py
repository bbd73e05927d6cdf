"""What the daemon and the node commands create is private to their user.

Outside systemd the umask is usually 022, which would leave the journal,
the RocksDB cache and the embedded SeaweedFS data readable by every local
user. `serve`, `fsck` and `import-metadata` create directories 0700 and
files 0600 whatever the umask; the way to the mount stays open.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
from collections.abc import Iterator

import pytest

from gateway.client.sync import SyncClient
from tests.helpers.daemon import Daemon, run_cli
from tests.helpers.mount import force_unmount, mount_entry, require_fuse
from tests.helpers.wait import wait_for

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

CONFIG = """
[tier2]
url = "embedded"
snapshot_interval = "0s"
"""


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask of a shell outside systemd (the children inherit it)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def loose_modes(top: pathlib.Path) -> list[str]:
    """Everything under ``top`` (itself included) that is not a 0700 dir or 0600 file."""
    found = []
    for path in [top, *top.rglob("*")]:
        if path.suffix == ".vif" and path.parent.name == "s3":
            # SeaweedFS chmods its volume info file to 0644 whatever the
            # umask (storage/volume_info SaveVolumeInfo: sizes and format
            # version, no data); its 0700 directory keeps it unreachable.
            continue
        st = path.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            if mode != 0o700:
                found.append(f"{oct(mode)} dir {path}")
        elif stat.S_ISREG(st.st_mode):
            if mode != 0o600:
                found.append(f"{oct(mode)} file {path}")
        elif not stat.S_ISLNK(st.st_mode) and mode & 0o077:
            found.append(f"{oct(mode)} {stat.filemode(st.st_mode)} {path}")
    return found


def cli(config: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--config", str(config), *args, timeout=120)


@pytest.mark.timeout(240)
def test_node_files_are_private_under_umask_022(tmp_path: pathlib.Path, umask_022: None) -> None:
    require_fuse()
    data_dir = tmp_path / "node"  # created by the daemon
    mnt = tmp_path / "srv" / "segments"  # so is the mountpoint, and its parent
    daemon = Daemon(tmp_path / "run", CONFIG)
    try:
        daemon.start(
            timeout=90,
            serve_args=("--data-dir", str(data_dir), "--mountpoint", str(mnt)),
        )

        def mounted() -> bool:
            assert daemon.alive(), daemon.log()
            return mount_entry(mnt) is not None

        wait_for(mounted, 30, f"a mount at {mnt}", interval=0.01, detail=daemon.log)
        with SyncClient(daemon.address) as c:
            c.create("logs/a")
            for _ in range(4):
                c.append("logs/a", os.urandom(100_000))
            c.flush()  # chunks and a metadata snapshot in the embedded S3 server
        # The mount is the kernel's: its modes are the filesystem's own, and
        # the directories made on the way to it stay open.
        assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o555
        assert stat.S_IMODE(os.stat(mnt / "logs" / "a").st_mode) == 0o444
        assert stat.S_IMODE(os.stat(tmp_path / "srv").st_mode) == 0o755
        assert daemon.stop(timeout=60) == 0, daemon.log()
    finally:
        daemon.kill()
        force_unmount(mnt)
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o755
    names = {p.relative_to(data_dir).parts[0] for p in data_dir.rglob("*")}
    assert {"journal", "cache", "s3"} <= names
    assert list(data_dir.glob("journal/*.wal")) and (data_dir / "journal" / "LOCK").exists()
    assert loose_modes(data_dir) == []

    # fsck opens the cache (RocksDB writes new files) and starts SeaweedFS.
    config = daemon.config_path
    config.write_text(CONFIG + f'\n[node]\ndata_dir = "{data_dir}"\n')
    r = cli(config, "fsck")
    assert r.returncode == 0, r.stdout + r.stderr
    assert loose_modes(data_dir) == []

    # Disaster recovery writes a new journal (and a cache) from Tier 2.
    shutil.rmtree(data_dir / "journal")
    shutil.rmtree(data_dir / "cache")
    r = cli(config, "import-metadata", "--from-tier2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(data_dir.glob("journal/*.wal"))
    assert loose_modes(data_dir) == []
