"""The systemd unit, sysusers.d and tmpfiles.d files, checked by systemd's own tools.

systemd is not running here, but its tools work offline: ``systemd-analyze
verify`` loads the unit as PID 1 would, ``systemd-sysusers --root`` and
``systemd-tmpfiles --root`` apply the other two files to an empty root.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import stat
import subprocess

import pytest

from gateway.config import DEFAULT_CONFIG_PATH, Config

from .conftest import ROOT

UNIT = ROOT / "systemd" / "segment-gateway.service"
SYSUSERS = ROOT / "systemd" / "segment-gateway.sysusers"
TMPFILES = ROOT / "systemd" / "segment-gateway.tmpfiles"
PACKAGED_CONFIG = ROOT / "packaging" / "gateway.toml"
PREFIX = "/opt/segment-gateway"

#: Settings that give a service a mount namespace of its own. Any one of them
#: cuts mount propagation towards the host, so the FUSE mount would be seen
#: by the daemon alone (systemd.exec(5), MountFlags=); the unit says why.
NAMESPACING = {
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
    "PrivateNetwork", "PrivateIPC", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
    "ExecPaths", "NoExecPaths", "BindPaths", "BindReadOnlyPaths", "TemporaryFileSystem",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectProc", "ProcSubset", "RootDirectory", "RootImage",
    "MountImages", "ExtensionImages", "ExtensionDirectories", "LogNamespace", "MountAPIVFS",
}  # fmt: skip


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (make install adds the systemd package)")
    return path


def unit_settings(path: pathlib.Path = UNIT) -> dict[str, list[str]]:
    """``Section.Key`` -> every value it is given, in order (keys may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def seconds(value: str) -> float:
    """A systemd time span like ``90s``, ``3min`` or ``1min 30s``, in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total


def verify(unit_text: str, tmp_path: pathlib.Path) -> str:
    """Everything ``systemd-analyze verify`` says about a unit (empty: no complaint).

    verify insists that the commands exist, so the copy points them at stub
    executables under ``tmp_path``. It exits 0 even for unknown keys and bad
    values ("..., ignoring"), so what counts is its output, not its status.
    """
    analyze = _tool("systemd-analyze")
    stubs = tmp_path / "opt" / "segment-gateway" / "bin"
    stubs.mkdir(parents=True, exist_ok=True)
    for name in ("segment-gateway", "python"):
        stub = stubs / name
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    unit = tmp_path / "segment-gateway.service"
    unit.write_text(unit_text.replace(f"{PREFIX}/bin/", f"{stubs}/"))
    r = subprocess.run(
        [analyze, "verify", "--man=no", "--generators=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (r.stdout + r.stderr).strip()
    if r.returncode != 0:
        output += f"\n(exit status {r.returncode})"
    return output


def test_the_unit_verifies_cleanly(tmp_path: pathlib.Path) -> None:
    assert verify(UNIT.read_text(), tmp_path) == ""


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (("Type=notify", "Type=notfy"), "Failed to parse service type"),
        (("WatchdogSec=", "WatchdogSecs="), "Unknown key"),
        (("DeviceAllow=/dev/fuse rw", "DeviceAllow=/dev/fuse rwx"), "Invalid device rights"),
        (("@system-service", "@system-servce"), "Unknown system call group"),
    ],
)
def test_verify_catches_a_broken_unit(
    tmp_path: pathlib.Path, change: tuple[str, str], complaint: str
) -> None:
    # The check above is only worth something if a mistake makes verify speak.
    broken = UNIT.read_text().replace(*change)
    assert complaint in verify(broken, tmp_path)


def test_the_unit_runs_the_daemon_the_documented_way() -> None:
    s = unit_settings()
    config = f"{DEFAULT_CONFIG_PATH}"
    assert s["Service.Type"] == ["notify"]
    assert s["Service.NotifyAccess"] == ["main"]
    assert s["Service.ExecStartPre"] == [f"{PREFIX}/bin/segment-gateway check-config {config}"]
    assert s["Service.ExecStart"] == [f"{PREFIX}/bin/segment-gateway --config {config} serve"]
    assert s["Service.ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["Service.Restart"] == ["on-failure"]
    assert s["Service.WatchdogSec"] == ["30s"]
    # SIGTERM to the daemon alone: it stops the embedded S3 server after the
    # flush that needs it.
    assert s["Service.KillMode"] == ["mixed"]
    assert s["Service.User"] == s["Service.Group"] == ["segment-gateway"]
    assert s["Service.StateDirectory"] == s["Service.CacheDirectory"] == ["segment-gateway"]
    assert s["Service.ConfigurationDirectory"] == ["segment-gateway"]
    assert s["Install.WantedBy"] == ["multi-user.target"]


def test_the_unit_timeouts_cover_the_daemon_defaults() -> None:
    s = unit_settings()
    defaults = Config()
    # Stop: drain, then the Tier-2 flush, then checkpoint and the embedded S3
    # server's stop, with room to spare before systemd's SIGKILL.
    stop = defaults.server.drain_timeout + defaults.tier2.stop_flush_timeout
    assert seconds(s["Service.TimeoutStopSec"][0]) >= stop + 30
    # Start: the Tier-2 check alone may retry for retry_deadline.
    assert seconds(s["Service.TimeoutStartSec"][0]) >= defaults.tier2.retry_deadline + 60


def test_the_unit_lets_the_fuse_mount_reach_the_host() -> None:
    s = unit_settings()
    keys = {k.partition(".")[2] for k in s}
    assert keys.isdisjoint(NAMESPACING), sorted(keys & NAMESPACING)
    assert s.get("Service.MountFlags", ["shared"]) == ["shared"]
    # Mounting with mount(2) and unmounting with umount2(2), no setuid helper.
    assert s["Service.AmbientCapabilities"] == ["CAP_SYS_ADMIN"]
    assert s["Service.CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert s["Service.NoNewPrivileges"] == ["yes"]
    assert s["Service.DevicePolicy"] == ["closed"]
    assert s["Service.DeviceAllow"] == ["/dev/fuse rw"]
    assert "@mount" in s["Service.SystemCallFilter"][0].split()


def test_the_read_ahead_command_runs_as_root_and_may_fail() -> None:
    (post,) = unit_settings()["Service.ExecStartPost"]
    prefixes, _, command = post.partition("/")
    assert set(prefixes) == {"-", "+"}  # ignore failure; full privileges
    assert command.startswith("opt/segment-gateway/bin/python -c ")


def test_sysusers_and_tmpfiles_apply_to_an_empty_root(tmp_path: pathlib.Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles needs root to give directories an owner")
    sysusers, tmpfiles = _tool("systemd-sysusers"), _tool("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    # Where the .deb puts them; the tools look a bare name up there.
    for src, kind in ((SYSUSERS, "sysusers.d"), (TMPFILES, "tmpfiles.d")):
        dest = root / "usr" / "lib" / kind / "segment-gateway.conf"
        dest.parent.mkdir(parents=True)
        shutil.copy(src, dest)

    r = subprocess.run(
        [sysusers, f"--root={root}", "segment-gateway.conf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    passwd = {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc" / "passwd").read_text().splitlines()
    }
    _, _, uid, gid, _, home, shell = passwd["segment-gateway"]
    assert int(uid) < 1000  # a system user
    assert home == Config().node.data_dir
    assert shell == "/usr/sbin/nologin"
    groups = {
        line.split(":")[0]: line.split(":")[2]
        for line in (root / "etc" / "group").read_text().splitlines()
    }
    assert groups["segment-gateway"] == gid

    r = subprocess.run(
        [tmpfiles, f"--root={root}", "--create", "segment-gateway.conf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
    packaged = Config.load(PACKAGED_CONFIG)
    expected = {
        packaged.node.data_dir: 0o750,
        packaged.cache.dir: 0o750,
        packaged.fuse.mountpoint: 0o755,
    }
    for path, mode in expected.items():
        st = (root / path.lstrip("/")).stat()
        assert stat.S_ISDIR(st.st_mode), path
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, int(uid), int(gid)), path
