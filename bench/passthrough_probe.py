#!/usr/bin/env python3
"""Passthrough probe: can FUSE passthrough serve a local file at local-file speed?

Groundwork for issue 34 (reads at the kernel's limit). It times large
sequential reads (1 MiB ``readinto`` loops) of one file of ``--size`` bytes on
the local disk, and of the same file through libfuse's own example file
systems mounted over its directory, in the same run:

- the local file, page cache dropped (cold) and read again (warm);
- ``passthrough_ll`` built from this machine's libfuse3-dev examples
  (``-o cache=always``): every read is a READ request its daemon answers;
- ``passthrough_hp`` built from a libfuse with passthrough (>= 3.16; by
  default Debian trixie's ``fuse3`` source package, fetched with ``apt-get
  source`` and a private source list, built with meson), once with
  ``--nopassthrough`` (the same daemon answering READs) and once with
  passthrough on (the kernel reads the backing file itself).

Each mount is fresh for each round; cold means the page cache was dropped
after mounting. The order of the systems rotates between rounds. Reported:
the median MB/s over ``--repeat`` rounds, every run, the ratio to the local
file at the same temperature, and the CPU the FUSE daemon used per read.

With ``--pyfuse3-python``, two more rows: the one-file pyfuse3 file system
of ``bench/passthrough/passthrough_pyfuse3.py`` (run by that Python, whose
pyfuse3 carries ``packaging/patches/pyfuse3-3.5.0-passthrough.patch``),
serving reads itself and by passthrough, with the READ requests it served.

Evidence that passthrough served the reads: the FUSE requests each
``passthrough_hp`` mode received while reading a small file, counted from
libfuse's own debug log (``--debug-fuse``); passthrough_hp also answers any
READ with EIO in passthrough mode, so a complete, byte-exact read is proof
that no read reached the daemon. The backing ids it opened and closed are
counted from its ``--debug`` log in the timed runs.

Needs root (to drop the page cache and mount), /dev/fuse, gcc, g++, meson,
ninja, dpkg-source and network access to deb.debian.org (missing Debian
tools are installed). Every mount is unmounted lazily and every daemon
killed however the program ends.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from common import (  # noqa: E402
    argument_parser,
    drop_page_cache,
    ensure_debian_tool,
    log,
    print_result,
    result_header,
    stop_on_signals,
    terminate,
    wait_mounted,
    work_directory,
)

MIB = 1024 * 1024
BLOCK = MIB  # the reader's request size
MOUNT_TIMEOUT = 20.0
EVIDENCE_SIZE = 8 * MIB
LOCAL = "local file"
LL = "passthrough_ll (libfuse {v}, cache=always)"
HP_OFF = "passthrough_hp (libfuse {v}, --nopassthrough)"
HP_ON = "passthrough_hp (libfuse {v}, passthrough)"
PY_DAEMON = "pyfuse3 + patch (daemon reads, keep_cache)"
PY_ON = "pyfuse3 + patch (passthrough)"
#: The one-file pyfuse3 file system, run by --pyfuse3-python.
PYFUSE3_FS = BENCH / "passthrough" / "passthrough_pyfuse3.py"
#: What the examples that come with this machine's libfuse3-dev need to build.
SYSTEM_EXAMPLES = pathlib.Path("/usr/share/doc/libfuse3-dev/examples")


# -- building libfuse's examples ------------------------------------------------------------


def run(command: list[str], cwd: pathlib.Path | None = None, timeout: float = 900) -> str:
    """Run ``command``; its stdout, or SystemExit with its output if it fails."""
    proc = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
            f"{proc.stderr[-2000:]}"
        )
    return proc.stdout


def build_system_passthrough_ll(work: pathlib.Path) -> tuple[pathlib.Path, str]:
    """passthrough_ll from the installed libfuse3-dev's examples; its path and libfuse version."""
    ensure_debian_tool("pkg-config", "pkg-config")
    if not (SYSTEM_EXAMPLES / "passthrough_ll.c").exists():
        ensure_debian_tool("gcc", "gcc")
        subprocess.run(["apt-get", "install", "-y", "-qq", "libfuse3-dev"], check=True,
                       stdout=sys.stderr)  # fmt: skip
    out = work / "ll-system"
    out.mkdir()
    for name in ("passthrough_ll.c", "passthrough_helpers.h"):
        shutil.copy(SYSTEM_EXAMPLES / name, out / name)
    flags = run(["pkg-config", "fuse3", "--cflags", "--libs"]).split()
    run(["gcc", "-O2", "-Wall", "passthrough_ll.c", *flags, "-o", "passthrough_ll"], cwd=out)
    version = run(["pkg-config", "--modversion", "fuse3"]).strip()
    return out / "passthrough_ll", version


def fetch_libfuse_source(work: pathlib.Path, suite: str) -> tuple[pathlib.Path, str]:
    """Debian ``suite``'s fuse3 source package, unpacked with its patches; its dir and version.

    apt-get with a source list, state and cache of its own under ``work``:
    the machine's apt configuration is left as it is.
    """
    ensure_debian_tool("dpkg-source", "dpkg-dev")
    apt = work / "apt"
    (apt / "lists" / "partial").mkdir(parents=True)
    (apt / "cache" / "archives" / "partial").mkdir(parents=True)
    (apt / "sources.list").write_text(f"deb-src http://deb.debian.org/debian {suite} main\n")
    options = [
        f"-oDir::Etc::SourceList={apt / 'sources.list'}",
        f"-oDir::Etc::SourceParts={apt / 'none'}",
        f"-oDir::State::Lists={apt / 'lists'}",
        f"-oDir::Cache={apt / 'cache'}",
        "-oAPT::Sandbox::User=root",
        "-qq",
    ]
    log(f"fetching Debian {suite}'s fuse3 source package")
    run(["apt-get", *options, "update"])
    src = work / "src"
    src.mkdir()
    run(["apt-get", *options, "source", "--download-only", "fuse3"], cwd=src)
    dsc = next(src.glob("fuse3_*.dsc"))
    run(["dpkg-source", "-x", dsc.name, "fuse3"], cwd=src)
    version = dsc.name.removeprefix("fuse3_").removesuffix(".dsc")
    return src / "fuse3", version


def build_libfuse_examples(source: pathlib.Path, build: pathlib.Path) -> dict[str, pathlib.Path]:
    """passthrough_hp and passthrough_ll of ``source``, built with meson in ``build``."""
    for command, package in (("meson", "meson"), ("ninja", "ninja-build"), ("g++", "g++")):
        ensure_debian_tool(command, package)
    log(f"building libfuse's examples in {build}")
    run(
        ["meson", "setup", str(build), "-Dutils=false", "-Dtests=false", "-Dexamples=true",
         "-Ddisable-mtab=true", "-Dbuildtype=release"],
        cwd=source,
    )  # fmt: skip
    # One compile job at a time: the machine's cores are shared.
    run(["ninja", "-C", str(build), "-j1", "example/passthrough_hp", "example/passthrough_ll"])
    return {name: build / "example" / name for name in ("passthrough_hp", "passthrough_ll")}


def built_examples(
    work: pathlib.Path, reuse: pathlib.Path | None, suite: str
) -> tuple[dict[str, pathlib.Path], str]:
    """The newer libfuse's examples (from ``reuse``, a previous build dir, if given)."""
    if reuse is not None:
        paths = {n: reuse / "example" / n for n in ("passthrough_hp", "passthrough_ll")}
        version = run(["meson", "introspect", "--projectinfo", str(reuse)])
        found = re.search(r'"version":\s*"([^"]+)"', version)
        return paths, found.group(1) if found else "?"
    source, version = fetch_libfuse_source(work, suite)
    return build_libfuse_examples(source, work / "build"), version


# -- mounting and reading -------------------------------------------------------------------


def unmount(mountpoint: pathlib.Path) -> None:
    """Lazily unmount ``mountpoint`` if something is mounted there."""
    if not os.path.ismount(mountpoint):
        return
    tool = shutil.which("fusermount3")
    command = [tool, "-uz", str(mountpoint)] if tool else ["umount", "-l", str(mountpoint)]
    subprocess.run(command, check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def mounted(
    command: list[str], mountpoint: pathlib.Path, log_path: pathlib.Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a FUSE daemon in the foreground; yield it once ``mountpoint`` is mounted.

    However the block is left: unmount lazily, SIGTERM, then SIGKILL.
    """
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    try:
        wait_mounted(proc, lambda: os.path.ismount(mountpoint), command[0], log_path,
                     MOUNT_TIMEOUT, interval=0.02)  # fmt: skip
        yield proc
    finally:
        unmount(mountpoint)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)  # a daemon may report what it served once unmounted
        terminate(proc)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of process ``pid`` (all its threads) so far; 0 for None."""
    if pid is None:
        return 0.0
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_whole(path: pathlib.Path, buffer: bytearray) -> tuple[int, float]:
    """Read ``path`` from start to end in ``len(buffer)`` requests; bytes and seconds."""
    view = memoryview(buffer)
    total = 0
    started = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while n := os.readv(fd, [view]):
            total += n
    finally:
        os.close(fd)
    return total, time.perf_counter() - started


def samples_match(path: pathlib.Path, expected: dict[int, str]) -> bool:
    """Whether the 1 MiB blocks of ``path`` at the offsets in ``expected`` have those digests."""
    with open(path, "rb") as f:
        for offset, digest in expected.items():
            f.seek(offset)
            if hashlib.sha256(f.read(MIB)).hexdigest() != digest:
                return False
    return True


def make_file(path: pathlib.Path, size: int) -> dict[int, str]:
    """Write ``size`` random bytes to ``path`` (fsynced); digests of a few 1 MiB samples."""
    samples: dict[int, str] = {}
    offsets = {0, (size // 2) // MIB * MIB, max(0, size - MIB)}
    with open(path, "wb") as f:
        for offset in range(0, size, MIB):
            block = os.urandom(min(MIB, size - offset))
            if offset in offsets:
                samples[offset] = hashlib.sha256(block).hexdigest()
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    return samples


class Systems:
    """The mounts to compare: name -> the daemon's command (None for the local file)."""

    def __init__(
        self,
        ll: pathlib.Path,
        ll_version: str,
        hp: pathlib.Path,
        hp_version: str,
        pyfuse3_python: pathlib.Path | None,
    ):
        self.commands: dict[str, list[str] | None] = {
            LOCAL: None,
            LL.format(v=ll_version): [str(ll), "-f", "-o", "cache=always,source={src}", "{mnt}"],
            HP_OFF.format(v=hp_version): [
                str(hp), "--foreground", "--debug", "--nopassthrough", "{src}", "{mnt}"
            ],
            HP_ON.format(v=hp_version): [str(hp), "--foreground", "--debug", "{src}", "{mnt}"],
        }  # fmt: skip
        if pyfuse3_python is not None:
            for name, mode in ((PY_DAEMON, "daemon"), (PY_ON, "passthrough")):
                self.commands[name] = [
                    str(pyfuse3_python), str(PYFUSE3_FS), "{src}/segment", "{mnt}", "--mode", mode
                ]  # fmt: skip

    def command(self, name: str, src: pathlib.Path, mnt: pathlib.Path) -> list[str] | None:
        """The daemon's command line for ``name`` mirroring ``src`` at ``mnt``."""
        template = self.commands[name]
        if template is None:
            return None
        return [a.format(src=src, mnt=mnt) for a in template]


def one_round(
    name: str,
    command: list[str] | None,
    work: pathlib.Path,
    samples: dict[int, str],
    size: int,
    buffer: bytearray,
) -> dict[str, Any]:
    """Cold then warm read of the file, directly or through a fresh mount of ``command``."""
    src, mnt = work / "src", work / "mnt"
    target = src / "segment" if command is None else mnt / "segment"
    log_path = work / "daemon.log"
    with contextlib.ExitStack() as stack:
        pid = None
        if command is not None:
            pid = stack.enter_context(mounted(command, mnt, log_path)).pid
        out: dict[str, Any] = {}
        drop_page_cache()
        for temperature in ("cold", "warm"):
            cpu = cpu_seconds(pid)
            got, seconds = read_whole(target, buffer)
            if got != size:
                raise RuntimeError(f"{name}: read {got} bytes of {size}")
            out[temperature] = {
                "MBps": size / seconds / 1e6,
                "daemon_cpu_s": cpu_seconds(pid) - cpu,
            }
        if not samples_match(target, samples):
            raise RuntimeError(f"{name}: the bytes read differ from the file's")
    if command is not None:
        text = log_path.read_text(errors="replace")
        out["backing_files_opened"] = text.count("setup shared backing file")
        out["read_errors_logged"] = text.count("fuse_passthrough read failed")
        served = [line for line in text.splitlines() if line.startswith("{")]
        if served:  # the pyfuse3 file system's report
            out["served"] = json.loads(served[-1])
    return out


def evidence(work: pathlib.Path, systems: Systems) -> dict[str, Any]:
    """FUSE requests passthrough_hp received, per opcode, reading an 8 MiB file once."""
    src, mnt = work / "src-evidence", work / "mnt"
    src.mkdir()
    samples = make_file(src / "segment", EVIDENCE_SIZE)
    result: dict[str, Any] = {}
    for name, template in systems.commands.items():
        if template is None or "passthrough_hp" not in name:
            continue
        command = [a.format(src=src, mnt=mnt) for a in template]
        command.insert(1, "--debug-fuse")
        log_path = work / "evidence.log"
        with mounted(command, mnt, log_path):
            drop_page_cache()
            got, _ = read_whole(mnt / "segment", bytearray(BLOCK))
            exact = samples_match(mnt / "segment", samples)
        text = log_path.read_text(errors="replace")
        opcodes = collections.Counter(re.findall(r"opcode: ([A-Z_]+)", text))
        result[name] = {
            "bytes_read": got,
            "bytes_match": exact and got == EVIDENCE_SIZE,
            "requests": dict(sorted(opcodes.items())),
            "backing_files_opened": text.count("setup shared backing file"),
            "library": (re.findall(r"FUSE library version: (\S+)", text) or ["?"])[0],
            "kernel_protocol": (re.findall(r"INIT: (\d+\.\d+)", text) or ["?"])[0],
        }
    shutil.rmtree(src)
    return result


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per system and temperature, every run, and ratios to the local file."""
    table: dict[str, Any] = {}
    local = {t: statistics.median(r[t]["MBps"] for r in runs[LOCAL]) for t in ("cold", "warm")}
    for name, rounds in runs.items():
        row: dict[str, Any] = {}
        for t in ("cold", "warm"):
            speeds = [r[t]["MBps"] for r in rounds]
            median = statistics.median(speeds)
            row[t] = {
                "MBps": round(median, 1),
                "runs_MBps": [round(s, 1) for s in speeds],
                "ratio_to_local": round(median / local[t], 3),
                "daemon_cpu_s": round(statistics.median(r[t]["daemon_cpu_s"] for r in rounds), 3),
            }
        if "served" in rounds[0]:
            row["served"] = {k: sum(r["served"][k] for r in rounds) for k in rounds[0]["served"]}
        elif "backing_files_opened" in rounds[0]:
            row["backing_files_opened"] = sum(r["backing_files_opened"] for r in rounds)
            row["read_errors_logged"] = sum(r["read_errors_logged"] for r in rounds)
        table[name] = row
    return table


def kernel_facts() -> dict[str, Any]:
    """The kernel's release, the disk's read-ahead and the FUSE module's parameters."""
    facts: dict[str, Any] = {"release": os.uname().release}
    params = pathlib.Path("/sys/module/fuse/parameters")
    if params.is_dir():
        facts["fuse_module_parameters"] = {
            p.name: p.read_text().strip() for p in sorted(params.iterdir()) if p.is_file()
        }
    config = pathlib.Path(f"/boot/config-{os.uname().release}")
    if config.exists():
        facts["CONFIG_FUSE_PASSTHROUGH"] = next(
            (
                line.split("=", 1)[1]
                for line in config.read_text().splitlines()
                if line.startswith("CONFIG_FUSE_PASSTHROUGH=")
            ),
            "not set",
        )
    return facts


def main() -> None:
    parser = argument_parser(
        __doc__,
        repeat_help="rounds of every system (default 3)",
        quick_help="a 128 MiB file instead of 512 MiB",
    )
    parser.add_argument("--size", type=int, help="the file's size in bytes (default 512 MiB)")
    parser.add_argument(
        "--suite", default="trixie", help="the Debian suite whose fuse3 source to build"
    )
    parser.add_argument(
        "--libfuse-build",
        type=pathlib.Path,
        help="a meson build dir of libfuse >= 3.16 with its examples, instead of building one",
    )
    parser.add_argument(
        "--pyfuse3-python",
        type=pathlib.Path,
        help="a Python whose pyfuse3 has bench/passthrough's patch: adds its rows",
    )
    args = parser.parse_args()
    stop_on_signals()
    if os.geteuid() != 0:
        raise SystemExit("passthrough_probe needs root (drop the page cache, mount, backing files)")
    size = args.size or (128 if args.quick else 512) * MIB
    result = result_header("passthrough_probe")
    result["kernel"] = kernel_facts()
    result["size_bytes"] = size
    result["read_size_bytes"] = BLOCK
    result["repeat"] = args.repeat
    with work_directory(args.dir, "passthrough-probe-") as work:
        build = work / "build"
        build.mkdir()
        ll, ll_version = build_system_passthrough_ll(build)
        newer, hp_version = built_examples(build, args.libfuse_build, args.suite)
        result["libfuse"] = {"system": ll_version, "built": hp_version}
        systems = Systems(ll, ll_version, newer["passthrough_hp"], hp_version, args.pyfuse3_python)
        (work / "src").mkdir()
        (work / "mnt").mkdir()
        try:
            log("evidence: FUSE requests per passthrough_hp mode, 8 MiB read once")
            result["evidence"] = evidence(work, systems)
            log(f"writing a {size // MIB} MiB file")
            samples = make_file(work / "src" / "segment", size)
            buffer = bytearray(BLOCK)
            runs: dict[str, list[dict[str, Any]]] = {n: [] for n in systems.commands}
            names = list(systems.commands)
            for round_ in range(args.repeat):
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    log(f"round {round_ + 1}/{args.repeat}: {name}")
                    command = systems.command(name, work / "src", work / "mnt")
                    runs[name].append(one_round(name, command, work, samples, size, buffer))
        finally:
            unmount(work / "mnt")
    result["reads"] = summarize(runs)
    print_result(result)


if __name__ == "__main__":
    main()
