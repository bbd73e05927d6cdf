"""packaging/monitoring/: the alerting rules and the dashboard, against the real Prometheus.

Debian's ``promtool`` checks the rules, and unit-tests every alert on input
series taken from real daemons' ``/metrics`` (tests/helpers/alert_scenarios.py
says how a scenario changes them); every dashboard expression is parsed by
promtool and must name series a real daemon exports; and one test runs a real
``prometheus`` that scrapes a real daemon whose embedded S3 server is killed
and kept down, whose mount fails a read and whose journal disk is filled,
until the matching alerts fire in Prometheus's own API.

The daemons: one node with an embedded SeaweedFS, a mount, TLS (a certificate
that expires in CERT_DAYS days) and its journal on a small tmpfs (the
end-to-end test fills it), and a replicating pair with takeovers on, whose
metrics (replication, takeovers, the lease) the first one does not have.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import pathlib
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from gateway.client.sync import SyncClient
from gateway.errors import Overloaded
from tests.helpers import alert_scenarios
from tests.helpers.daemon import Daemon, scrape
from tests.helpers.disk import fill, tmpfs
from tests.helpers.mount import MountedDaemon, require_fuse
from tests.helpers.prometheus import (
    ALERTS,
    DASHBOARD,
    JOB,
    PrometheusServer,
    Sample,
    exported_names,
    promtool,
    require_prometheus,
    scrape_samples,
    shortened_for,
)
from tests.helpers.replicated import ReplicatedCluster
from tests.helpers.wait import wait_for
from tests.test_embedded_daemon import holding_port, weed_pids

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedS3

# Daemons, SeaweedFS, FUSE and Prometheus: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

KiB = 1024
#: The monitored node's TLS certificate expires this many days after the test starts.
CERT_DAYS = 10
OPERATIONS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "OPERATIONS.md"


@dataclass
class Watched:
    """A real daemon and what its /metrics said once it had data."""

    daemon: Daemon
    #: HOST:PORT of its /metrics (the ``instance`` Prometheus gives it).
    address: str
    text: str
    samples: list[Sample]
    #: Unix time of that scrape.
    scraped_at: float
    ca: pathlib.Path | None = None
    #: The tmpfs its journal is on (None: not root, no tmpfs).
    journal_fs: pathlib.Path | None = None


def _config(tls: pathlib.Path, journal_dir: pathlib.Path) -> str:
    return f"""
[server]
tls_cert = "{tls / "cert.pem"}"
tls_key = "{tls / "key.pem"}"
max_message_bytes = "1 MiB"
[journal]
dir = "{journal_dir}"
file_size = "1 MiB"
preallocate_step = "256 KiB"
max_pending_bytes = "1 MiB"
max_group_bytes = "512 KiB"
max_frame_bytes = "256 KiB"
max_operation_bytes = "512 KiB"
[container]
max_append_bytes = "256 KiB"
overload_timeout = "1s"
[tier2]
url = "embedded"
flush_interval = "200ms"
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    """The embedded-S3 node with a mount, TLS and a journal on a 16 MiB tmpfs, with
    data: ``w/read`` flushed and read through the mount, ``w/cold`` flushed and
    never read (its blocks are only in Tier 2)."""
    require_prometheus()
    require_fuse()
    import trustme

    root = tmp_path_factory.mktemp("watched")
    tls = root / "tls"
    tls.mkdir()
    ca = trustme.CA()
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=CERT_DAYS)
    cert = ca.issue_cert("127.0.0.1", not_after=expires)
    cert.cert_chain_pems[0].write_to_path(str(tls / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tls / "key.pem"))
    ca.cert_pem.write_to_path(str(tls / "ca.pem"))
    with contextlib.ExitStack() as stack:
        journal_fs: pathlib.Path | None = None
        with contextlib.suppress(pytest.skip.Exception):  # no tmpfs: no full disk below
            journal_fs = stack.enter_context(tmpfs(root / "journal-fs", "16m"))
        journal_dir = (journal_fs or root) / "journal"
        daemon = MountedDaemon(root / "node", root / "mnt", config_text=_config(tls, journal_dir))
        stack.callback(daemon.teardown)
        daemon.start(timeout=60)
        data = os.urandom(600 * KiB)
        with SyncClient(daemon.address, tls_ca=str(tls / "ca.pem")) as c:
            for name in ("w/read", "w/cold"):
                c.create(name)
                for i in range(0, len(data), 200 * KiB):
                    c.append(name, data[i : i + 200 * KiB])
                c.flush(name)
        assert (daemon.mnt / "w" / "read").read_bytes() == data
        address = f"127.0.0.1:{daemon.metrics_port}"
        text, samples = scrape_samples(address)
        yield Watched(daemon, address, text, samples, time.time(), tls / "ca.pem", journal_fs)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, seaweedfs: EmbeddedS3) -> list[Watched]:
    """Two replicating nodes with takeovers on, scraped after an append, then killed
    (only their /metrics are needed)."""
    require_prometheus()
    cluster = ReplicatedCluster(
        tmp_path_factory.mktemp("pair"), seaweedfs, nodes=("node-a", "node-b"),
        write_quorum=2, ack_quorum=2, takeover=True,
    )  # fmt: skip
    try:
        cluster.start()
        with cluster.client("node-a") as c:
            c.create("p/s")
            c.append("p/s", b"x" * 1000)
        scraped = []
        for d in cluster.daemons.values():
            address = f"127.0.0.1:{d.metrics_port}"
            text, samples = scrape_samples(address)
            scraped.append(Watched(d, address, text, samples, time.time()))
        return scraped
    finally:
        cluster.teardown()


def rules() -> list[dict[str, Any]]:
    """Every rule of alerts.yml."""
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


# -- the rules, statically --------------------------------------------------------------


@pytest.mark.timeout(60)
def test_promtool_accepts_the_rules() -> None:
    require_prometheus()
    out = promtool("check", "rules", ALERTS)
    assert f"SUCCESS: {len(rules())} rules found" in out, out


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.timeout(60)
def test_every_alert_has_a_severity_a_summary_and_a_runbook_in_operations_md() -> None:
    doc = OPERATIONS.read_text()
    monitoring = doc.split("\n## Monitoring", 1)[1].split("\n## ", 1)[0]
    runbooks = {_anchor(h) for h in re.findall(r"^#### (.+)$", monitoring, re.MULTILINE)}
    names = set()
    for rule in rules():
        name = rule["alert"]
        names.add(name)
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) == {"summary", "runbook_url"}, name
        url = rule["annotations"]["runbook_url"]
        assert url == f"file:///usr/share/doc/segment-gateway/OPERATIONS.md#{name.lower()}", url
        assert name.lower() in runbooks, f"no runbook '#### {name}' in the Monitoring section"
    # And no runbook for an alert that does not exist.
    assert runbooks == {n.lower() for n in names}


# -- the rules on real series -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_each_alert_fires_on_its_fault_and_no_other_does(
    node: Watched, pair: list[Watched], tmp_path: pathlib.Path
) -> None:
    """`promtool test rules` over series taken from the three daemons' scrapes:
    unchanged (only the real certificate's expiry fires), and changed the way
    each fault changes them (alert_scenarios.py), asserting at chosen minutes
    the exact set of firing alerts, their labels and annotations."""
    instances = [(w.address, w.samples, w.scraped_at) for w in (node, *pair)]
    test_file = alert_scenarios.write_tests(tmp_path, ALERTS, rules(), instances)
    out = promtool("test", "rules", test_file.name, cwd=tmp_path)
    assert "SUCCESS" in out, out
    # The check of the check: a rule over a series the daemon does not export
    # (misspelt) never fires, and that is caught.
    one = alert_scenarios.write_tests(
        tmp_path, ALERTS, rules(), instances, [alert_scenarios.journal_failed], "one.json"
    )
    broken = ALERTS.read_text().replace(
        "expr: segment_gateway_journal_failed == 1", "expr: segment_gateway_journal_fialed == 1"
    )
    (tmp_path / "alerts.yml").write_text(broken)
    with pytest.raises(AssertionError, match="alertname: SegmentGatewayJournalFailed, time: 31m"):
        promtool("test", "rules", one.name, cwd=tmp_path)


# -- the dashboard ------------------------------------------------------------------------


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


#: What Grafana puts in place of the variables the expressions use.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$job": JOB,
    "$node": "127.0.0.1:9411",
}


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expression with the variables replaced) of every target."""
    exprs = []
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: an unknown variable in {expr}"
            exprs.append((panel["title"], expr))
    return exprs


@pytest.mark.timeout(60)
def test_the_dashboard_is_a_grafana_dashboard_with_a_datasource_and_a_node_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["type"] == "query" and variables["node"]["includeAll"]
    assert {"schemaVersion", "title", "uid", "panels", "time"} <= set(board)
    repeated = [p for p in board["panels"] if p.get("repeat") == "node"]
    assert repeated and all(p["type"] == "row" for p in repeated)
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"] and set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel
        for target in panel["targets"]:
            assert "refId" in target and target["expr"].strip(), panel["title"]


@pytest.mark.timeout(60)
def test_every_dashboard_expression_parses(tmp_path: pathlib.Path) -> None:
    """Each expression as a recording rule: promtool parses them all."""
    require_prometheus()
    exprs = dashboard_expressions()
    group = {
        "name": "dashboard",
        "rules": [{"record": f"dashboard_expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)],
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [group]}))
    out = promtool("check", "rules", path)
    assert f"SUCCESS: {len(exprs)} rules found" in out, out


@pytest.mark.timeout(60)
def test_every_series_the_dashboard_and_the_rules_name_is_exported(
    node: Watched, pair: list[Watched]
) -> None:
    """Every ``segment_gateway_*`` name in an expression is one a real daemon serves."""
    exported: set[str] = set()
    for w in (node, *pair):
        exported |= exported_names(w.text)
    series = re.compile(r"\bsegment_gateway_\w+")
    used = {title: set(series.findall(e)) for title, e in dashboard_expressions()}
    for rule in rules():
        used[rule["alert"]] = set(series.findall(rule["expr"]))
    missing = {where: sorted(names - exported) for where, names in used.items() if names - exported}
    assert not missing, missing
    # Every panel and rule but the one on Prometheus's own `up` is over the daemon's series.
    assert [where for where, names in used.items() if not names] == ["SegmentGatewayDown"]


# -- end to end: a real Prometheus, a real daemon, real faults ----------------------------

#: Fire whatever else happens: the faults below cause exactly these.
MUST_FIRE = {
    ("SegmentGatewayEmbeddedS3Down", "critical"),
    ("SegmentGatewayTier2Errors", "warning"),
    ("SegmentGatewayMountReadErrors", "critical"),
    ("SegmentGatewayCertificateExpiry", "warning"),
}
#: Also when the journal disk can be filled (a tmpfs: root).
MUST_FIRE_FULL = {
    ("SegmentGatewayJournalDiskFull", "critical"),
    ("SegmentGatewayJournalRefusingAppends", "warning"),
    ("SegmentGatewayJournalDiskAlmostFull", "warning"),
}
#: May fire too: a disk filled in a second is also "filling up".
MAY_FIRE = {("SegmentGatewayJournalDiskFillingUp", "warning")}


def keep_journal_disk_full(node: Watched, client: SyncClient) -> None:
    """Unless the journal is short of space, fill its tmpfs and append until refused.

    The first refusal makes the journal checkpoint and delete its files whose
    data is in Tier 2 already (it gets out of a full disk by itself): room
    again. With Tier 2 down nothing more can go, and the next fill holds.
    """
    assert node.journal_fs is not None
    metrics_port = int(node.address.rsplit(":", 1)[1])
    if scrape(metrics_port)["segment_gateway_journal_short_of_space"] == 1:
        return
    fill(node.journal_fs)  # truncates the last ballast, then takes every byte
    with pytest.raises(Overloaded):
        for _ in range(100):
            client.append("w/read", os.urandom(200 * KiB))


def firing(prometheus: PrometheusServer) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"]["severity"]) for a in prometheus.alerts()}


@pytest.mark.timeout(120)
@pytest.mark.expect_errors(
    r"embedded S3 server \(SeaweedFS, pid \d+\) exited",
    r"journal refused client operations",
    r"read of 'w/cold' at offset \d+ \(\d+ bytes\) failed: embedded S3 server is down",
)
def test_a_real_prometheus_fires_the_alerts_of_real_faults(
    node: Watched, tmp_path: pathlib.Path
) -> None:
    """alerts.yml with its ``for:`` cut to 1 s (`shortened_for`), everything else as
    shipped; a 1 s scrape and evaluation interval."""
    prometheus = PrometheusServer(tmp_path / "prometheus", [node.address],
                                  shortened_for(ALERTS.read_text()))  # fmt: skip
    prometheus.start()
    try:
        # Healthy, but for the certificate, which does expire in CERT_DAYS days.
        wait_for(
            lambda: firing(prometheus) == {("SegmentGatewayCertificateExpiry", "warning")},
            30, "only the certificate's alert firing", interval=0.2,
            detail=lambda: (prometheus.api("alerts"), prometheus.log()),
        )  # fmt: skip
        (target,) = prometheus.api("targets")["activeTargets"]
        assert target["health"] == "up" and target["labels"]["instance"] == node.address

        must = MUST_FIRE | (MUST_FIRE_FULL if node.journal_fs else set())
        s3_dir = node.daemon.data_dir / "s3"
        s3_port = json.loads((s3_dir / "embedded-s3.json").read_text())["ports"]["s3"]
        (pid,) = weed_pids(s3_dir)
        os.kill(pid, signal.SIGKILL)
        # The restarts fail while the port is taken: the server stays down.
        with holding_port(s3_port), SyncClient(node.daemon.address, tls_ca=str(node.ca)) as c:
            c.append("w/read", b"not flushed while S3 is down")
            with pytest.raises(OSError) as e:
                (node.daemon.mnt / "w" / "cold").read_bytes()
            assert e.value.errno == errno.EIO

            def fired() -> bool:
                if node.journal_fs:
                    keep_journal_disk_full(node, c)
                return must <= firing(prometheus)

            try:
                wait_for(
                    fired, 40, f"{sorted(must)} firing", interval=0.2,
                    detail=lambda: (prometheus.api("alerts"), prometheus.log()),
                )  # fmt: skip
                assert firing(prometheus) <= must | MAY_FIRE
                for alert in prometheus.alerts():
                    assert alert["labels"]["instance"] == node.address
                    assert alert["labels"]["job"] == JOB
            finally:
                if node.journal_fs:
                    (node.journal_fs / "ballast").unlink(missing_ok=True)
    finally:
        prometheus.stop()
