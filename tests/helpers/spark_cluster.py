"""A Spark standalone cluster whose workers each see their own directory at one path.

Tests of a multi-node read need executors on different "nodes" that all read
the same path (``fixed_path``, e.g. ``<tmp>/segments``) yet see different
data there, as they would on separate machines each mounting its local
gateway. On one machine that is done with mount namespaces: every worker is
started as ``unshare --mount --propagation private -- sh -c 'mount --bind
SOURCE_i FIXED && exec spark-class ... Worker ...'``, so the bind is visible
only to that worker and to the executors (and Python workers) it forks. The
host's ``fixed_path`` stays as it was.

Usage::

    with SparkCluster(tmp / "spark", tmp / "segments", [src0, src1, src2]) as cluster:
        spark = cluster.session("my test")
        print(executor_view(spark, tmp / "segments", "node.txt", 3))

Needs root (for ``unshare --mount``), Java and pyspark. Every process is
started in its own session and is killed with its whole process group by
:meth:`SparkCluster.stop`, which never waits more than a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tests.helpers.daemon import free_port
from tests.helpers.spark_session import stop_local_spark
from tests.helpers.wait import wait_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Heap of the master and of each worker daemon (not of their executors).
DAEMON_MEMORY = "512m"
#: What each worker offers and each executor takes: one executor per worker.
EXECUTOR_MEMORY = "1g"


class SparkClusterError(RuntimeError):
    """The cluster did not come up (the message ends with the tails of its logs)."""


def spark_home() -> pathlib.Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return pathlib.Path(pyspark.__file__).resolve().parent


def java_home() -> str | None:
    """``$JAVA_HOME``, else the installation the ``java`` on PATH belongs to."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        return None
    # /usr/bin/java is an alternatives symlink chain ending in <home>/bin/java.
    return str(pathlib.Path(java).resolve().parent.parent)


def require_cluster() -> None:
    """Skip where a cluster cannot run (mount namespaces need root and unshare; Java)."""
    import pytest

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mount namespaces need root and unshare")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java")


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"({e})"
    return "\n".join(text.splitlines()[-lines:])


class SparkCluster:
    """One standalone master and ``len(sources)`` workers on 127.0.0.1.

    Worker ``i`` runs in its own mount namespace where ``sources[i]`` is
    bind-mounted on ``fixed_path``; ``fixed_path`` must be an existing
    directory. Logs go to ``work_dir/logs``. With ``follow_sources`` each
    source is made a shared mount and the workers' namespaces slaves of it:
    a mount put on ``sources[i]`` later (a gateway node's mount) shows at
    ``fixed_path`` in worker ``i``, so one cluster serves several modules
    (tests/conftest.py, ``spark_standalone``).
    """

    def __init__(
        self,
        work_dir: pathlib.Path,
        fixed_path: pathlib.Path,
        sources: list[pathlib.Path],
        follow_sources: bool = False,
    ) -> None:
        if not sources:
            raise ValueError("a cluster needs at least one worker source")
        self.work_dir = work_dir
        self.fixed_path = fixed_path
        self.sources = list(sources)
        self.n = len(sources)
        self.home = spark_home()
        self.log_dir = work_dir / "logs"
        self.master_port = free_port()
        self.master_webui_port = free_port()
        self.master_log = self.log_dir / "master.log"
        self.worker_logs = [self.log_dir / f"worker-{i}.log" for i in range(self.n)]
        self.follow_sources = follow_sources
        self._shared: list[pathlib.Path] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._session: SparkSession | None = None

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` of the master."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def status_url(self) -> str:
        """The master's JSON status page."""
        return f"http://127.0.0.1:{self.master_webui_port}/json/"

    @property
    def process_groups(self) -> set[int]:
        """Process group ids of the master and workers (with their executors) still started."""
        return {proc.pid for proc in self._procs}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        conf_dir = self.work_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        env.update(
            SPARK_HOME=str(self.home),
            # An empty configuration directory: no spark-defaults.conf or
            # spark-env.sh of the machine leaks into the test.
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_WORKER_DIR=str(self.work_dir / "work"),
            SPARK_NO_DAEMONIZE="1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            # Spark 4 turns the master's REST submission server on by default,
            # on the fixed port 6066 that two clusters would fight over.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            # Executors start Python workers with the driver's choice
            # (spark.pyspark.python); this only covers anything launched
            # without it.
            PYSPARK_PYTHON=sys.executable,
        )
        home = java_home()
        if home:
            env["JAVA_HOME"] = home
        return env

    def _spawn(self, argv: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.work_dir,
                # Its own process group: stop() kills the JVM and every
                # executor it forked without touching pytest.
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def master_status(self) -> dict[str, Any] | None:
        """The master's JSON status, or None while it cannot answer."""
        try:
            with urllib.request.urlopen(self.status_url, timeout=2) as r:
                status: dict[str, Any] = json.load(r)
        except (OSError, ValueError):
            return None
        return status

    def alive_workers(self) -> int:
        """How many workers the master lists as ALIVE (0 while it cannot answer)."""
        status = self.master_status()
        if status is None:
            return 0
        if "aliveworkers" in status:
            return int(status["aliveworkers"])
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def _check_alive(self) -> None:
        for proc in self._procs:
            if proc.poll() is not None:
                raise SparkClusterError(
                    f"{proc.args!r} exited with {proc.returncode}\n{self.logs()}"
                )

    def _wait(
        self, check: Callable[[], bool], seconds: float, failure: str, interval: float
    ) -> None:
        """`wait_for`, failing with a :class:`SparkClusterError` that ends with the logs."""
        try:
            wait_for(check, seconds, failure, interval=interval)
        except AssertionError as e:
            raise SparkClusterError(f"{e}\n{self.logs()}") from None

    def logs(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the master's and every worker's log."""
        parts = [
            f"--- {p.name} ---\n{_tail(p, lines)}" for p in [self.master_log, *self.worker_logs]
        ]
        return "\n".join(parts)

    def start(self, timeout: float = 120) -> None:
        """Start the master and the workers; return once all workers are registered.

        Raises :class:`SparkClusterError` (with the log tails) if a process
        dies or the workers are not all registered within ``timeout`` seconds;
        the processes already started are stopped first.
        """
        if not self.fixed_path.is_dir():
            raise SparkClusterError(f"{self.fixed_path} must be an existing directory")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spark_class = str(self.home / "bin" / "spark-class")
        try:
            self._spawn(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.master_webui_port),
                ],
                self.master_log,
            )
            deadline = time.monotonic() + timeout

            def master_up() -> bool:
                self._check_alive()
                return self.master_status() is not None

            # A worker that finds no master retries only after seconds of
            # backoff: start the workers once the master answers.
            self._wait(master_up, timeout, f"no master after {timeout}s", interval=0.1)
            if self.follow_sources:
                for source in self.sources:
                    # A shared mount of its own: what is mounted on it later
                    # in this namespace propagates to the worker's copy.
                    bind = ["mount", "--bind", str(source), str(source)]
                    subprocess.run(bind, check=True, timeout=10)
                    self._shared.append(source)
                    share = ["mount", "--make-shared", str(source)]
                    subprocess.run(share, check=True, timeout=10)
            for i in range(self.n):
                self._spawn(self._worker_argv(i), self.worker_logs[i])

            def workers_up() -> bool:
                self._check_alive()
                return self.alive_workers() >= self.n

            self._wait(
                workers_up,
                max(0.0, deadline - time.monotonic()),
                f"not all {self.n} workers registered after {timeout}s",
                interval=0.25,
            )
        except BaseException:
            self.stop()
            raise

    def _worker_argv(self, i: int) -> list[str]:
        work = self.work_dir / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        # Paths go in as positional parameters, not spliced into the
        # script, so no quoting can break.
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        # private: nothing of the host's later mounts reaches the worker;
        # slave (follow_sources): mounts on its source do, nothing goes back.
        propagation = "slave" if self.follow_sources else "private"
        return [
            "unshare", "--mount", "--propagation", propagation, "--",
            "sh", "-c", script, "sh", str(self.sources[i]), str(self.fixed_path),
            str(self.home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
            self.master_url, "--cores", "1", "--memory", EXECUTOR_MEMORY,
            "--host", "127.0.0.1", "--webui-port", str(free_port()), "--work-dir", str(work),
        ]  # fmt: skip

    def restart_dead_workers(self, timeout: float = 120) -> None:
        """Start again the workers that died or were killed; return once all are registered.

        A cluster shared by several modules comes back whole after one
        killed a worker (its storage node's host died).
        """
        for i in range(self.n):
            if self._procs[1 + i].poll() is not None:
                _signal_group(self._procs[1 + i], signal.SIGKILL)  # its executors too
                proc = self._spawn(self._worker_argv(i), self.worker_logs[i])
                self._procs.pop()
                self._procs[1 + i] = proc

        def workers_up() -> bool:
            self._check_alive()
            return self.alive_workers() >= self.n

        self._wait(workers_up, timeout, f"not all {self.n} workers back", interval=0.25)

    def stop_session(self) -> None:
        """Stop the current session (its executors end), leaving the cluster up."""
        if self._session is not None:
            session, self._session = self._session, None
            session.stop()

    def session(self, app: str, timeout: float = 120) -> SparkSession:
        """A SparkSession on this cluster, returned once all its executors are registered.

        One executor of one core per worker; the Python workers run this
        interpreter. Stopped by :meth:`stop`.
        """
        from pyspark.sql import SparkSession

        from pipeline.jvm import jar_path

        # One SparkContext per process: the suite's shared local session
        # makes way (the next module that needs it starts it again).
        stop_local_spark()
        # The driver JVM starts Python planners (Python data sources) from its
        # environment, not from spark.pyspark.python: this interpreter too.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = SparkSession.builder
        jar = jar_path()
        if jar is not None:
            # On the driver's class path only if the JVM starts with it: this
            # session may be the first of the process (the suite's local one
            # reuses the same JVM), and it ships the jar to the executors too.
            builder = builder.config("spark.jars", str(jar))
        spark = (
            builder.master(self.master_url)
            .appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", EXECUTOR_MEMORY)
            .config("spark.cores.max", str(self.n))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(self.n))
            .config("spark.pyspark.python", sys.executable)
            .config("spark.pyspark.driver.python", sys.executable)
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .getOrCreate()
        )
        self._session = spark
        if spark.sparkContext.master != self.master_url:
            # getOrCreate() hands back any session already running in this
            # process, whatever master it was built with.
            raise SparkClusterError(
                f"a session on {spark.sparkContext.master} is already running in this process"
            )
        spark.sparkContext.setLogLevel("ERROR")

        def executors_up() -> bool:
            self._check_alive()
            return self.executor_count() >= self.n

        # Tasks go only to registered executors: without this wait the first
        # job may run everything on whichever executor came up first.
        self._wait(
            executors_up,
            timeout,
            f"not all {self.n} executors registered after {timeout}s",
            interval=0.25,
        )
        return spark

    def executor_count(self) -> int:
        """Executors registered with the current session's driver (the driver not counted)."""
        if self._session is None:
            return 0
        jsc: Any = self._session.sparkContext._jsc  # no public API for this
        return int(jsc.sc().getExecutorMemoryStatus().size()) - 1

    def stop(self, grace: float = 5) -> None:
        """Stop the session, then the workers and the master; safe to call twice.

        SIGTERM to each process group, SIGKILL to what is left after
        ``grace`` seconds: never hangs on a JVM that ignores SIGTERM. The
        sources' own mounts (follow_sources) go last.
        """
        if self._session is not None:
            session, self._session = self._session, None
            with contextlib.suppress(Exception):
                session.stop()
        # Workers first, so they do not spend the grace period reconnecting
        # to a master that is gone.
        procs = list(reversed(self._procs))
        self._procs.clear()
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            # Also when the leader is gone: an executor may outlive its worker.
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # SIGKILL is asynchronous and wait() covers only the leaders: wait for
        # the executors too, so no JVM outlives stop().
        groups = {proc.pid for proc in procs}
        with contextlib.suppress(AssertionError):  # best effort: never hang in a teardown
            wait_for(lambda: not live_group_members(groups), 5, "the executors gone")
        while self._shared:
            subprocess.run(["umount", "-l", str(self._shared.pop())], timeout=10)

    def kill_worker(self, i: int, timeout: float = 60) -> None:
        """SIGKILL worker ``i`` and its executors (its storage node's host died).

        Returns once the driver has dropped the executor, so the next job
        runs on the others.
        """
        proc = self._procs[1 + i]  # the master was started first
        before = self.executor_count()
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        self._wait(
            lambda: self.executor_count() < before,
            timeout,
            f"executor of worker {i} still registered after {timeout}s",
            interval=0.2,
        )

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def live_group_members(groups: set[int]) -> list[int]:
    """Pids of the processes in process groups ``groups`` that are not zombies.

    Zombies are left out: ``spark-class`` leaves one (the ``bash`` of its
    process substitution) that only init reaps once the JVM is gone.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after it.
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in groups and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # start_new_session made the pid the process group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def executor_view(
    spark: SparkSession, fixed_path: pathlib.Path, name: str, n: int, rounds: int = 10
) -> dict[str, set[str]]:
    """What each executor reads at ``fixed_path/name``, by executor id.

    Runs many one-element tasks (``8 * n`` per round) until ``n`` executors
    have answered or ``rounds`` jobs ran; an unreadable file shows as
    ``"<ExceptionName>"``. The executor id comes from the Python worker's
    working directory, which a standalone executor sets to
    ``<work-dir>/<app-id>/<executor-id>``.
    """
    path = str(fixed_path / name)

    # A closure (not a module-level function) so that cloudpickle sends it by
    # value: executors need not be able to import tests.helpers.
    def look(_: int) -> tuple[str, str]:
        import os as os_

        try:
            with open(path) as f:
                seen = f.read()
        except OSError as e:
            seen = f"<{type(e).__name__}>"
        return os_.path.basename(os_.getcwd()), seen

    view: dict[str, set[str]] = {}
    sc = spark.sparkContext
    for _ in range(rounds):
        for executor, seen in sc.parallelize(range(8 * n), 8 * n).map(look).distinct().collect():
            view.setdefault(executor, set()).add(seen)
        if len(view) >= n:
            break
    return view
