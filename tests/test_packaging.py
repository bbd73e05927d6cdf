"""The .deb: built, installed on this machine, run the way the unit runs it, purged.

The module builds the package once (``packaging/build_deb.sh``), installs it
with ``dpkg -i`` and purges it at the end whatever happened. The tests run
in file order; the last one purges and checks what stays. A machine where
the package is already installed (or has its data directory) is left alone:
the tests skip rather than purge someone's daemon.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import pathlib
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gateway import __version__
from gateway.config import Config
from tests.helpers.mount import force_unmount, mount_entry
from tests.helpers.wait import wait_for

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PACKAGE = "segment-gateway"
USER = "segment-gateway"
PREFIX = pathlib.Path("/opt/segment-gateway")
CONFIG = pathlib.Path("/etc/segment-gateway/gateway.toml")
UNIT = pathlib.Path("/usr/lib/systemd/system/segment-gateway.service")
DATA_DIR = pathlib.Path("/var/lib/segment-gateway")
MOUNTPOINT = pathlib.Path("/srv/segments")
PACKAGED_CONFIG = ROOT / "packaging" / "gateway.toml"
#: Serialises runs of this module on one machine (two suites at once would
#: install and purge under each other).
LOCK = pathlib.Path("/run/lock/segment-gateway-packaging-test.lock")
CAP_SYS_ADMIN = 21


def run(*cmd: str | os.PathLike[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output (never raises on a failure status)."""
    kwargs.setdefault("timeout", 120)
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [str(c) for c in cmd], capture_output=True, text=True, check=False, **kwargs
    )


def dpkg(*args: str) -> subprocess.CompletedProcess[str]:
    """dpkg, waiting up to a minute for its lock if apt or dpkg runs elsewhere."""
    deadline = time.monotonic() + 60
    while True:
        r = run("dpkg", *args, timeout=300)
        if r.returncode == 0 or "lock" not in r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(1)


def installed() -> bool:
    """Whether dpkg has the package installed (not merely its conffiles)."""
    r = run("dpkg-query", "-W", "-f=${Status}", PACKAGE)
    return r.stdout.strip() == "install ok installed"


def as_user(user: str, *cmd: str | os.PathLike[str]) -> list[str]:
    """``cmd`` run as ``user`` with its groups and no capabilities."""
    gid = pwd.getpwnam(user).pw_gid
    return ["setpriv", f"--reuid={user}", f"--regid={gid}", "--init-groups", *map(str, cmd)]


@dataclass
class Deb:
    """The package built and installed for this module."""

    path: pathlib.Path
    build_seconds: float


def test_the_packaged_configuration_is_a_storage_node_default() -> None:
    text = PACKAGED_CONFIG.read_text()
    config = Config.load(PACKAGED_CONFIG)
    assert config.node.data_dir == str(DATA_DIR)
    assert config.cache.dir == "/var/cache/segment-gateway"
    assert config.fuse.mountpoint == str(MOUNTPOINT)
    assert config.fuse.allow_other  # Spark's executors are other users
    assert config.tier2.url == "embedded"
    assert re.search(r'^# url = "s3://', text, re.MULTILINE)


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deb]:
    """Build the .deb, install it; afterwards purge it and undo what the tests left."""
    if os.geteuid() != 0:
        pytest.skip("installing a .deb needs root")
    if run("which", "dpkg-deb").returncode != 0 or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("not a Debian system with python3")
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed() or DATA_DIR.exists():
            pytest.skip(f"{PACKAGE} is installed here, or {DATA_DIR} exists: not touching it")
        user_existed = run("getent", "passwd", USER).returncode == 0
        # Staged and written under the test's own directory: a `make deb`
        # running meanwhile keeps its build/ and dist/.
        work = tmp_path_factory.mktemp("deb")
        env = {**os.environ, "DEB_BUILD_DIR": str(work / "build"), "DEB_DIST_DIR": str(work)}
        started = time.monotonic()
        r = run(ROOT / "packaging" / "build_deb.sh", cwd=ROOT, env=env, timeout=500)
        build_seconds = time.monotonic() - started
        assert r.returncode == 0, r.stdout + r.stderr
        found = re.search(r"^build_deb: (\S+\.deb) ", r.stdout, re.MULTILINE)
        assert found, r.stdout
        path = pathlib.Path(found.group(1))
        shutil.rmtree(work / "build")  # 200+ MiB that pytest would keep around
        try:
            r = dpkg("-i", str(path))
            assert r.returncode == 0, r.stdout + r.stderr
            yield Deb(path, build_seconds)
        finally:
            if installed():
                dpkg("--purge", PACKAGE)
            force_unmount(MOUNTPOINT)
            run("rm", "-rf", DATA_DIR)
            with contextlib.suppress(OSError):
                MOUNTPOINT.rmdir()
            if not user_existed:
                run("userdel", USER)
            path.unlink()


def test_the_package_installs_the_daemon_and_its_files(deb: Deb) -> None:
    print(
        f"built {deb.path.name} ({deb.path.stat().st_size >> 20} MiB) in {deb.build_seconds:.0f}s"
    )
    sg = PREFIX / "bin" / "segment-gateway"
    r = run(sg, "version")
    assert (r.returncode, r.stdout) == (0, f"segment-gateway {__version__}\n"), r.stderr
    assert os.readlink("/usr/bin/segment-gateway") == str(sg)
    # The unit's ExecStartPre, as root and as the daemon's user.
    expected = f"{CONFIG}: ok (node node-1, journal {DATA_DIR}/journal)\n"
    for cmd in ([sg, "check-config", CONFIG], as_user(USER, sg, "check-config", CONFIG)):
        r = run(*cmd)
        assert (r.returncode, r.stdout) == (0, expected), r.stderr

    # The configuration: a conffile, readable by the daemon's group only.
    r = run("dpkg-query", "-W", "-f=${Conffiles}", PACKAGE)
    assert str(CONFIG) in r.stdout
    assert CONFIG.read_text() == PACKAGED_CONFIG.read_text()
    st = CONFIG.stat()
    user = pwd.getpwnam(USER)
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 0, user.pw_gid)

    assert UNIT.read_text() == (ROOT / "systemd" / "segment-gateway.service").read_text()
    for kind, src in (("tmpfiles.d", "tmpfiles"), ("sysusers.d", "sysusers")):
        installed_file = pathlib.Path(f"/usr/lib/{kind}/segment-gateway.conf")
        assert (
            installed_file.read_text() == (ROOT / "systemd" / f"segment-gateway.{src}").read_text()
        )

    # segment-gateway(1), generated from the argparse definitions at build time.
    page = gzip.decompress(pathlib.Path("/usr/share/man/man1/segment-gateway.1.gz").read_bytes())
    assert page.startswith(b'.TH SEGMENT\\-GATEWAY "1"') and b"segment\\-gateway status" in page

    # The monitoring files (docs/OPERATIONS.md, "Monitoring"), as in the tree.
    for name in ("alerts.yml", "dashboard.json"):
        shipped = pathlib.Path("/usr/share/segment-gateway") / name
        assert shipped.read_bytes() == (ROOT / "packaging" / "monitoring" / name).read_bytes()
        assert shipped.stat().st_mode & 0o777 == 0o644
    r = run("dpkg-query", "-L", PACKAGE)
    assert "/usr/share/segment-gateway/alerts.yml" in r.stdout.splitlines()

    # The user and its directories, as postinst made them.
    assert user.pw_uid < 1000 and user.pw_dir == str(DATA_DIR)
    for path, mode in ((DATA_DIR, 0o750), (MOUNTPOINT, 0o755)):
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_uid) == (mode, user.pw_uid), path

    # The venv runs on Debian's interpreter and holds runtime dependencies only.
    py = pathlib.Path("/usr/bin/python3").resolve().name  # python3.X
    assert (PREFIX / "bin" / "python3").resolve() == pathlib.Path(f"/usr/bin/{py}")
    for module in ("pip", "pytest", "mypy"):
        assert run(PREFIX / "bin" / "python", "-c", f"import {module}").returncode != 0, module
    r = run("grep", "-rIl", str(deb.path.parent / "build"), PREFIX)
    assert r.stdout == "", "the staging path is written in these files"
    r = run("dpkg-query", "-W", "-f=${Depends}", PACKAGE)
    depends = {d.split()[0] for d in r.stdout.split(", ")}
    assert {py, "fuse3"} <= depends and "libfuse3-3" not in depends, r.stdout
    # pyfuse3 with passthrough, on the libfuse 3.17 shipped beside it (not the system's 3.14).
    lib = PREFIX / "opt" / "libfuse" / "lib" / "libfuse3.so.4"
    (ext,) = (PREFIX / "lib").glob("python3*/site-packages/pyfuse3/__init__.cpython-*.so")
    ldd = run("ldd", ext).stdout
    assert f"libfuse3.so.4 => {ext.parent}/../../../../opt/libfuse/lib/libfuse3.so.4" in ldd, ldd
    assert lib.is_file() and str(lib) in run("dpkg-query", "-L", PACKAGE).stdout.splitlines()
    r = run(PREFIX / "bin" / "python", "-c", "import pyfuse3; print(pyfuse3.backing_open)")
    assert "backing_open" in r.stdout, r.stderr


def _exec_start_post() -> list[str]:
    """The unit's ExecStartPost command line, without its "-+" prefix."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("ExecStartPost="):
            return shlex.split(line.partition("=")[2].lstrip("-+"))
    raise AssertionError("no ExecStartPost")


@contextlib.contextmanager
def fuse_device_for_everyone() -> Iterator[None]:
    """/dev/fuse mode 0666 for the duration, as udev makes it on a Debian host."""
    fuse = pathlib.Path("/dev/fuse")
    if not fuse.exists():
        pytest.skip("no /dev/fuse")
    mode = fuse.stat().st_mode & 0o777
    fuse.chmod(0o666)
    try:
        yield
    finally:
        fuse.chmod(mode)


def test_the_daemon_runs_from_the_package_as_the_service_user(deb: Deb) -> None:
    """As the unit starts it: its user, CAP_SYS_ADMIN alone, no new privileges."""
    user = pwd.getpwnam(USER)
    ready = DATA_DIR / "ready"
    cmd = [
        "setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
        "--inh-caps=-all,+sys_admin", "--ambient-caps=-all,+sys_admin",
        "--bounding-set=-all,+sys_admin", "--no-new-privs",
        PREFIX / "bin" / "segment-gateway", "--config", CONFIG, "serve",
        "--listen", "127.0.0.1:0", "--metrics-listen", "", "--ready-file", ready,
    ]  # fmt: skip
    log = DATA_DIR / "test-daemon.log"
    with fuse_device_for_everyone(), log.open("wb") as out:
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, cwd="/"
        )
        try:

            def ready_file(proc: subprocess.Popen[bytes] = proc) -> bool:
                assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
                return ready.exists()

            def logs() -> str:
                weed = DATA_DIR / "s3" / "weed.log"
                tail = weed.read_text(errors="replace")[-6000:] if weed.exists() else "(none)"
                return f"{log.read_text()}\n--- the tail of {weed}:\n{tail}"

            # Longer than the embedded server's own 60 s start bound, so its error is in the log.
            wait_for(ready_file, 90, "the installed daemon ready", detail=logs)
            address = ready.read_text().strip()

            status = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            assert fields["Uid"].split()[0] == str(user.pw_uid)
            assert int(fields["CapEff"], 16) == 1 << CAP_SYS_ADMIN
            assert fields["NoNewPrivs"].strip() == "1"

            # Mounted by a non-root process, in this (the host's) namespace.
            entry = mount_entry(MOUNTPOINT)
            assert entry is not None, "the mount is not visible outside the daemon"
            device, fstype, options = entry
            assert fstype == "fuse.segment-gateway"
            assert f"user_id={user.pw_uid}" in options.split(",")
            assert "allow_other" in options.split(",")

            r = run(
                PREFIX / "bin" / "segment-gateway", "append", "demo/lines", "--create",
                "--connect", address, input="one\ntwo\n",
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            # Any local user reads it (allow_other), here one with no rights at all.
            r = run(*as_user("nobody", "cat", MOUNTPOINT / "demo" / "lines"))
            assert (r.returncode, r.stdout) == (0, "one\ntwo\n"), r.stderr

            # The daemon's user cannot raise the read-ahead; the unit's root
            # ExecStartPost does.
            r = run(*_exec_start_post(), cwd="/")
            assert r.returncode == 0, r.stderr
            read_ahead = pathlib.Path(f"/sys/class/bdi/{device}/read_ahead_kb").read_text()
            assert int(read_ahead) == Config.load(CONFIG).fuse.read_ahead_kb

            # An upgrade (the same .deb again) with the daemon running and
            # mounted: postinst leaves the mount and the conffile alone.
            CONFIG.chmod(0o600)
            r = dpkg("-i", str(deb.path))
            assert r.returncode == 0, r.stdout + r.stderr
            assert CONFIG.stat().st_mode & 0o777 == 0o600
            CONFIG.chmod(0o640)
            assert proc.poll() is None and mount_entry(MOUNTPOINT) is not None

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()
            assert mount_entry(MOUNTPOINT) is None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            force_unmount(MOUNTPOINT)


def test_purge_removes_the_code_and_keeps_the_data(deb: Deb) -> None:
    DATA_DIR.joinpath("journal").mkdir(exist_ok=True)
    r = dpkg("--purge", PACKAGE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not installed()
    for gone in (PREFIX, CONFIG.parent, UNIT, pathlib.Path("/usr/bin/segment-gateway")):
        assert not os.path.lexists(gone), gone
    assert not pathlib.Path("/var/cache/segment-gateway").exists()
    # The journal (and the embedded S3 data) may hold the only copy of
    # acknowledged appends; the user still owns them.
    assert DATA_DIR.joinpath("journal").is_dir()
    assert run("getent", "passwd", USER).returncode == 0
