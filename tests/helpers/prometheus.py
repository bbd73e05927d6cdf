"""Debian's Prometheus for tests: promtool, a real server, and a daemon's samples.

packaging/monitoring/ is checked against the real tools (tests/test_monitoring.py):
``promtool check rules`` and ``promtool test rules`` on files the tests write,
and a real ``prometheus`` scraping a real daemon. `make install` installs
the ``prometheus`` package (scripts/bootstrap.sh); without it the tests skip.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.daemon import free_port
from tests.helpers.wait import wait_for

PROMTOOL = pathlib.Path("/usr/bin/promtool")
PROMETHEUS = pathlib.Path("/usr/bin/prometheus")
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
ALERTS = ROOT / "packaging" / "monitoring" / "alerts.yml"
DASHBOARD = ROOT / "packaging" / "monitoring" / "dashboard.json"
#: The scrape job the rules expect (`up{job="segment-gateway"}`).
JOB = "segment-gateway"


def require_prometheus() -> None:
    """Skip unless Debian's prometheus package (promtool and the server) is installed."""
    for tool in (PROMTOOL, PROMETHEUS):
        if not tool.exists():
            pytest.skip(f"{tool} is missing (make install adds Debian's prometheus package)")


def promtool(*args: str | pathlib.Path, cwd: pathlib.Path | None = None) -> str:
    """Run promtool; its output, or AssertionError with it when it fails."""
    r = subprocess.run(
        [str(PROMTOOL), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert r.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{r.stdout}{r.stderr}"
    return r.stdout


@dataclass(frozen=True)
class Sample:
    """One sample of a /metrics answer, with its family's type."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    #: counter, gauge, histogram, ...
    kind: str

    def with_labels(self, **more: str) -> Sample:
        """The same sample with more (or other) labels."""
        merged = {**dict(self.labels), **more}
        return Sample(self.name, tuple(sorted(merged.items())), self.value, self.kind)

    def selector(self) -> str:
        """``name{a="x",b="y"}``, as promtool's input series name it."""
        inside = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inside}}}"

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


def scrape_samples(address: str) -> tuple[str, list[Sample]]:
    """``GET /metrics`` at ``address`` (HOST:PORT): its text and every sample."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = [
        Sample(s.name, tuple(sorted(s.labels.items())), s.value, family.type)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    return text, samples


def exported_names(text: str) -> set[str]:
    """Every sample name a /metrics text can give (a family with no sample yet
    included: its ``# TYPE`` line says what its samples are called)."""
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[ {]", text, re.MULTILINE))
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", ""),
        }.get(kind, ("",))
        names.update(name + s for s in suffixes)
    return names


def shortened_for(rules_text: str, duration: str = "1s") -> str:
    """The rules with every ``for:`` made ``duration`` (the end-to-end test's rewrite:
    it waits seconds, not the minutes the rules wait; the expressions stay as they are)."""
    rewritten, n = re.subn(r"^(\s+)for: \S+$", rf"\g<1>for: {duration}", rules_text, flags=re.M)
    assert n > 0, "no for: in the rules"
    return rewritten


class PrometheusServer:
    """A real ``prometheus`` on a free loopback port, its data in ``directory``."""

    def __init__(self, directory: pathlib.Path, targets: list[str], rules_text: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        (directory / "alerts.yml").write_text(rules_text)
        # JSON is YAML: no YAML writer needed.
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "scrape_timeout": "1s",
            },
            "rule_files": [str(directory / "alerts.yml")],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it is ready."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(PROMETHEUS), f"--config.file={self.directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except urllib.error.HTTPError as e:  # 503 while it starts
                e.close()
                return False

        wait_for(ready, timeout, "prometheus ready", interval=0.1, detail=self.log)

    def api(self, path: str) -> Any:
        """``GET /api/v1/<path>``'s data (AssertionError unless its status is success)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=5) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        """Prometheus's own view of the alerts in ``state`` (``/api/v1/alerts``)."""
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop within 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
