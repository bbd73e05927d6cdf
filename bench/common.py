"""What the benchmarks share: their skeleton (arguments, the JSON document, the
met/not-met wording, dropping the page cache, progress on stderr), fio as the
disk baseline, medians, the Markdown table and a daemon to measure."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def ensure_fio() -> str:
    """fio's path, installing Debian's package if it is missing."""
    path = shutil.which("fio")
    if path:
        return path
    print("bench: installing fio", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "fio"]):
        subprocess.run(step, check=True, env=env, stdout=sys.stderr)
    path = shutil.which("fio")
    if not path:
        raise SystemExit("fio is not available")
    return path


def ensure_debian_tool(command: str, package: str) -> str:
    """``command``'s path, installing Debian's ``package`` if it is missing."""
    path = shutil.which(command)
    if path:
        return path
    print(f"bench: installing {package}", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # apt's output goes to stderr: stdout is the benchmark's JSON document.
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        subprocess.run(step, check=True, env=env, stdout=sys.stderr)
    path = shutil.which(command)
    if not path:
        raise SystemExit(f"{command} is not available")
    return path


def ensure_s3fs() -> str:
    """s3fs-fuse's path (Debian's ``s3fs``), installing it if it is missing."""
    return ensure_debian_tool("s3fs", "s3fs")


def ensure_rclone() -> str:
    """rclone's path (Debian's ``rclone``), installing it if it is missing."""
    return ensure_debian_tool("rclone", "rclone")


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


def wait_mounted(
    proc: subprocess.Popen[bytes],
    mounted: Callable[[], bool],
    name: str,
    log_path: pathlib.Path,
    timeout: float,
    interval: float = 0.05,
) -> None:
    """Until ``mounted()``: RuntimeError with the log's tail if ``proc`` (a FUSE server
    named ``name``) exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not mounted():
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name} exited with {proc.returncode} before mounting:\n"
                + log_path.read_text(errors="replace")[-2000:]
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not mount in {timeout:.0f}s")
        time.sleep(interval)


def wait_for_segment_files(data_dir: pathlib.Path, want: int, timeout: float) -> int:
    """Until ``want`` segment files (`fs.passthrough`: made in the background once
    the daemon served a sealed segment in full) are in ``data_dir``, or
    ``timeout`` seconds passed; how many there are. Temporary ones do not count."""
    files = data_dir / "segment-files"
    deadline = time.monotonic() + timeout
    while True:
        made = sum(1 for _ in files.glob("[0-9]*")) if files.is_dir() else 0
        if made >= want or time.monotonic() > deadline:
            return made
        time.sleep(0.05)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def drop_page_cache(warn: Callable[[str], None] | None = None) -> None:
    """Write back dirty pages, then drop the page cache (and dentries, inodes).

    Without root: ``warn`` and go on, or, with no ``warn``, exit (for a
    benchmark whose cold figures mean nothing warm).
    """
    os.sync()
    try:
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        if warn is None:
            raise SystemExit(f"cannot drop the page cache (needs root): {e}") from None
        warn(f"cannot drop the page cache ({e}); cold runs are warmer than they should be")


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over the runs."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def replace_table(path: pathlib.Path, start_marker: str, end_marker: str, lines: list[str]) -> None:
    """Rewrite the text between two markers of a Markdown file (markers included in ``lines``)."""
    text = path.read_text()
    start, end = text.index(start_marker), text.index(end_marker) + len(end_marker)
    path.write_text(text[:start] + "\n".join(lines) + text[end:])


# -- the skeleton every benchmark shares ----------------------------------------------------

#: Where benchmarks make their work directories unless told otherwise.
BENCH_TMP = ROOT / ".bench-tmp"


def log(message: str) -> None:
    """Progress on stderr (stdout holds the JSON document only)."""
    print(f"bench: {message}", file=sys.stderr, flush=True)


def argument_parser(
    doc: str | None,
    *,
    work_dir: pathlib.Path | None = BENCH_TMP,
    work_dir_help: str = "where the benchmark writes (default: .bench-tmp in the repo)",
    repeat: int | None = 3,
    repeat_help: str = "runs of everything (default 3)",
    quick_help: str | None = None,
    table: str = "PERFORMANCE.md",
) -> argparse.ArgumentParser:
    """The arguments every benchmark takes, described by the first paragraph of ``doc``.

    ``--dir`` (unless ``work_dir`` is None), ``--repeat`` (unless ``repeat``
    is None), ``--write-table`` (rewrite the benchmark's section of the named
    Markdown file) and, given its help, ``--quick``.
    """
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if work_dir is not None:
        parser.add_argument("--dir", type=pathlib.Path, default=work_dir, help=work_dir_help)
    if repeat is not None:
        parser.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    parser.add_argument("--write-table", type=pathlib.Path, metavar=table)
    if quick_help is not None:
        parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def result_header(benchmark: str) -> dict[str, Any]:
    """The fields every JSON document starts with: which benchmark, version, date, machine."""
    from gateway import __version__  # the callers put the repository on sys.path first

    return {
        "benchmark": benchmark,
        "version": __version__,
        "when": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
    }


def print_result(result: dict[str, Any]) -> None:
    """The benchmark's one JSON document, on stdout."""
    print(json.dumps(result, indent=2, ensure_ascii=False))


def met(ok: bool) -> str:
    """How a table or summary says whether a target was met."""
    return "met" if ok else "NOT met"


#: Config for Tier-1 benchmarks: a filesystem Tier 2 (under ``{root}``) that
#: never flushes during a run, so the figures are the journal's and the
#: cache's alone (bench/tier2.py measures flushing).
TIER2_OFF = (
    '[tier2]\nurl = "file://{root}/tier2"\n'
    'flush_size = "5 GiB"\nmax_chunk_size = "5 GiB"\nflush_interval = "24h"\n'
)


def sigterm_as_interrupt(signum: int, frame: types.FrameType | None) -> None:
    """A SIGTERM handler that behaves like Ctrl-C, so servers and files are cleaned up."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # raises, or trio raises later
        return
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """Stop cleanly (servers stopped, files removed) on Ctrl-C and SIGTERM.

    Even as a background job, which starts with SIGINT ignored.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)


@contextlib.contextmanager
def work_directory(parent: pathlib.Path, prefix: str) -> Iterator[pathlib.Path]:
    """A fresh directory under ``parent``, removed with its contents after the block.

    ``parent`` is made if missing, and then removed too if it is left empty.
    """
    created = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                parent.rmdir()


@contextlib.contextmanager
def running_daemon(
    work: pathlib.Path,
    config_text: str,
    data_dir: pathlib.Path | None = None,
    mountpoint: pathlib.Path | None = None,
) -> Iterator[str]:
    """Run a daemon (data in ``data_dir``, default a fresh ``work/data``); yield HOST:PORT.

    It mounts the segments at ``mountpoint`` if given (no mount otherwise).

    It is stopped with SIGTERM (SIGKILL if it does not exit in time) however
    the block is left, Ctrl-C included. Its own session keeps a terminal's
    Ctrl-C from reaching it first: the shutdown is ours to do.
    """
    config = work / "gateway.toml"
    config.write_text(config_text)
    ready = work / "ready"
    ready.unlink(missing_ok=True)  # a restart must not take the last run's file for its own
    log_path = work / "daemon.log"
    command = [
        sys.executable, "-m", "gateway.cli", "--config", str(config),
        "serve", "--data-dir", str(data_dir or work / "data"), "--listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--mountpoint", str(mountpoint or ""),
        "--metrics-listen", "",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited with {proc.returncode} before it was ready:\n"
                    + _tail(log_path)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon was not ready in {READY_TIMEOUT:.0f}s")
            time.sleep(0.02)
        yield ready.read_text().strip()
    finally:
        _stop(proc)
    if proc.returncode != 0:
        print(f"bench: daemon exited with {proc.returncode}:\n{_tail(log_path)}", file=sys.stderr)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        print("bench: the daemon did not stop in time; killing it", file=sys.stderr)
        proc.kill()
        proc.wait()
    except BaseException:  # interrupted while waiting
        proc.kill()
        proc.wait()
        raise


def _tail(path: pathlib.Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
