"""`promtool test rules` files for packaging/monitoring/alerts.yml, from real scrapes.

The input series are the samples of real daemons' ``/metrics`` (counters and
gauges), labelled with the ``instance`` (their metrics address) and ``job``
Prometheus would give them, one value a minute for MINUTES minutes. Each
scenario changes some of them from some minute on the way a fault changes
a node's metrics, and says which alerts fire at chosen minutes: promtool
checks, for every alert name of the rules, that exactly those fire then,
with those labels and annotations. A rule over a series the daemon does not
export, or with a wrong label, threshold, window or ``for``, fails here.

Time-stamp gauges (a certificate's expiry) are taken relative to the time of
their scrape: promtool's clock starts at 0.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.prometheus import JOB, Sample

#: Minutes of input series (one value a minute).
MINUTES = 200
#: Gauges whose value is a Unix time: moved to promtool's clock.
TIMESTAMPS = (
    "segment_gateway_tls_certificate_expiry_timestamp_seconds",
    "segment_gateway_fsck_last_run_timestamp_seconds",
)
DAY = 86400
P = "segment_gateway_"

Value = float | str  # a number, "stale", or "_" (no sample)


@dataclass(frozen=True)
class Alert:
    """An alert expected to fire: its name, severity and labels (severity left out)."""

    name: str
    severity: str
    labels: tuple[tuple[str, str], ...]


@dataclass
class Scenario:
    """One test group: the series as scraped, changed by a fault, and what must fire."""

    name: str
    samples: dict[str, Sample]
    #: The instances: the embedded node's, node-a's, node-b's metrics addresses.
    e: str
    a: str
    b: str
    values: dict[str, list[Value]] = field(default_factory=dict)
    checks: dict[int, list[Alert]] = field(default_factory=dict)
    #: Fire at every check from minute 10 on while their instance is scraped
    #: (the embedded node's certificate, which expires in days).
    standing: list[Alert] = field(default_factory=list)
    gone_at: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.values = {sel: [s.value] * (MINUTES + 1) for sel, s in self.samples.items()}

    # -- finding series --------------------------------------------------------------

    def one(self, name: str, instance: str, **labels: str) -> str:
        """The one series ``name`` of ``instance`` with these labels (AssertionError if not one)."""
        found = [
            sel
            for sel, s in self.samples.items()
            if s.name == name
            and s.label("instance") == instance
            and all(s.label(k) == v for k, v in labels.items())
        ]
        assert len(found) == 1, f"{self.name}: {name} {instance} {labels}: {found}"
        return found[0]

    def value(self, selector: str, minute: int = 0) -> float:
        v = self.values[selector][minute]
        assert isinstance(v, float), (selector, minute, v)
        return v

    # -- faults ---------------------------------------------------------------------

    def step(self, selector: str, at: int, value: float) -> None:
        """From minute ``at`` on, ``value``."""
        for t in range(at, MINUTES + 1):
            self.values[selector][t] = float(value)

    def ramp(self, selector: str, at: int, per_minute: float) -> None:
        """From minute ``at`` on, ``per_minute`` more each minute (the first at ``at``)."""
        start = self.value(selector, at - 1)
        for t in range(at, MINUTES + 1):
            self.values[selector][t] = start + per_minute * (t - at + 1)

    def gone(self, instance: str, at: int) -> None:
        """The instance stops answering at ``at``: its series go stale, ``up`` is 0."""
        self.gone_at[instance] = at
        for sel, s in self.samples.items():
            if s.label("instance") != instance:
                continue
            if s.name == "up":
                self.step(sel, at, 0)
            else:
                self.values[sel][at] = "stale"
                for t in range(at + 1, MINUTES + 1):
                    self.values[sel][t] = "_"

    # -- expectations ------------------------------------------------------------------

    def alert(self, name: str, severity: str, selector: str, drop: tuple[str, ...] = ()) -> Alert:
        """The alert a rule makes of this series: its labels but the name and ``drop``."""
        labels = tuple((k, v) for k, v in self.samples[selector].labels if k not in drop)
        return Alert(name, severity, labels)

    def expect(self, minute: int, *alerts: Alert) -> None:
        """Exactly these alerts (and the standing ones) fire at ``minute``."""
        standing = [
            a
            for a in self.standing
            if minute >= 10 and self.gone_at.get(dict(a.labels)["instance"], math.inf) > minute
        ]
        self.checks[minute] = [*alerts, *standing]


def _render(values: list[Value]) -> str:
    """promtool's expanding notation: runs of one step as ``a+bxn``."""
    tokens = []
    i, n = 0, len(values)
    while i < n:
        v = values[i]
        if isinstance(v, str):
            j = i
            while v == "_" and j + 1 < n and values[j + 1] == "_":
                j += 1
            tokens.append(v if j == i else f"_x{j - i + 1}")
            i = j + 1
            continue
        j = i
        step = None
        while j + 1 < n and isinstance(w := values[j + 1], float):
            d = w - values[j]  # type: ignore[operator]
            if step is not None and d != step:
                break
            step = d
            j += 1
        if j == i:
            tokens.append(repr(v))
        else:
            assert step is not None
            sign = "+" if step >= 0 else "-"
            tokens.append(f"{v!r}{sign}{abs(step)!r}x{j - i}")
        i = j + 1
    return " ".join(tokens)


def _annotations(rules: list[dict[str, Any]], alert: Alert) -> dict[str, str]:
    """The rule's annotations for this alert, ``{{ $labels.x }}`` filled in."""
    (rule,) = [
        r for r in rules if r["alert"] == alert.name and r["labels"]["severity"] == alert.severity
    ]
    labels = dict(alert.labels)
    out = {}
    for key, template in rule["annotations"].items():
        text = template
        for name, value in labels.items():
            text = text.replace("{{ $labels." + name + " }}", value)
        assert "{{" not in text, f"{alert.name}: only {{{{ $labels.x }}}} is filled in: {text}"
        out[key] = text
    return out


def write_tests(
    directory: pathlib.Path,
    alerts: pathlib.Path,
    rules: list[dict[str, Any]],
    scrapes: list[tuple[str, list[Sample], float]],
    scenarios: list[Callable[[Scenario], None]] | None = None,
    name: str = "tests.json",
) -> pathlib.Path:
    """Write ``directory``/alerts.yml (a copy) and the test file ``name``; returns the latter.

    ``scrapes``: (instance, samples, Unix time of the scrape) of the embedded
    node, node-a and node-b, in that order; ``scenarios``: SCENARIOS unless given.
    """
    shutil.copy(alerts, directory / "alerts.yml")
    base: dict[str, Sample] = {}
    for instance, samples, scraped_at in scrapes:
        up = Sample("up", (("instance", instance), ("job", JOB)), 1.0, "gauge")
        base[up.selector()] = up
        for s in samples:
            if s.kind not in ("counter", "gauge"):
                continue
            s = s.with_labels(instance=instance, job=JOB)
            if s.name in TIMESTAMPS:
                s = Sample(s.name, s.labels, s.value - scraped_at, s.kind)
            base[s.selector()] = s
    names = sorted({r["alert"] for r in rules})
    groups = []
    for make in scenarios or SCENARIOS:
        sc = Scenario(make.__name__, base, *(i for i, _, _ in scrapes))
        make(sc)
        assert sc.checks, sc.name
        cases = []
        for minute, expected in sorted(sc.checks.items()):
            for name in names:
                cases.append(
                    {
                        "eval_time": f"{minute}m",
                        "alertname": name,
                        "exp_alerts": [
                            {
                                "exp_labels": {**dict(a.labels), "severity": a.severity},
                                "exp_annotations": _annotations(rules, a),
                            }
                            for a in expected
                            if a.name == name
                        ],
                    }
                )
        groups.append(
            {
                "name": sc.name,
                "interval": "1m",
                "input_series": [
                    {"series": sel, "values": _render(v)} for sel, v in sorted(sc.values.items())
                ],
                "alert_rule_test": cases,
            }
        )
    path = directory / name
    # JSON is YAML: promtool reads it as it is.
    path.write_text(json.dumps({"rule_files": ["alerts.yml"], "tests": groups}, indent=1))
    return path


# -- the scenarios --------------------------------------------------------------------
#
# Minutes are when a fault starts and when the checks look: a check sits a
# minute or more away from the moment a `for:` or a window ends, so the
# scenarios do not depend on how promtool rounds.


def _certificate(sc: Scenario) -> Alert:
    sel = sc.one(P + "tls_certificate_expiry_timestamp_seconds", sc.e)
    return sc.alert("SegmentGatewayCertificateExpiry", "warning", sel)


def as_scraped(sc: Scenario) -> None:
    """Nothing changes: only the certificate, which expires in days, fires (after its 10 min)."""
    remaining = sc.value(sc.one(P + "tls_certificate_expiry_timestamp_seconds", sc.e))
    assert 2 * DAY < remaining < 14 * DAY, f"the node's certificate: {remaining / DAY} days"
    cert = _certificate(sc)
    sc.expect(5)
    sc.expect(60, cert)
    sc.expect(MINUTES - 1, cert)


def target_down(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    sc.gone(sc.e, 30)
    up = sc.one("up", sc.e)
    sc.expect(31)
    sc.expect(33, sc.alert("SegmentGatewayDown", "critical", up))


def restarts(sc: Scenario) -> None:
    """Two restarts ten minutes apart: the epoch goes up, the counters start again."""
    sc.standing = [_certificate(sc)]
    epoch = sc.one(P + "epoch", sc.e)
    for at in (40, 50):
        sc.step(epoch, at, sc.value(epoch, at - 1) + 1)
        for sel, s in sc.samples.items():
            if s.kind == "counter" and s.label("instance") == sc.e:
                sc.step(sel, at, 0)
    sc.expect(45)
    sc.expect(51, sc.alert("SegmentGatewayRestarting", "warning", epoch))
    sc.expect(85)


def journal_failed(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    failed = sc.one(P + "journal_failed", sc.e)
    sc.step(failed, 30, 1)
    sc.expect(29)
    sc.expect(31, sc.alert("SegmentGatewayJournalFailed", "critical", failed))


def journal_disk_full(sc: Scenario) -> None:
    """Filled at once: appends refused, then short of space for good."""
    sc.standing = [_certificate(sc)]
    short = sc.one(P + "journal_short_of_space", sc.e)
    refusals = sc.one(P + "journal_refusals_total", sc.e)
    free = sc.one(P + "journal_disk_free_bytes", sc.e)
    sc.step(short, 30, 1)
    sc.ramp(refusals, 30, 1)
    sc.step(free, 30, 0)
    refusing = sc.alert("SegmentGatewayJournalRefusingAppends", "warning", refusals)
    full = sc.alert("SegmentGatewayJournalDiskFull", "critical", short)
    almost = sc.alert("SegmentGatewayJournalDiskAlmostFull", "warning", free)
    filling = sc.alert("SegmentGatewayJournalDiskFillingUp", "warning", free)
    sc.expect(29)
    sc.expect(31, refusing)
    sc.expect(37, refusing, full, almost)
    sc.expect(47, refusing, full, almost, filling)


def journal_disk_filling(sc: Scenario) -> None:
    """Free space falls steadily to nothing at minute 180."""
    sc.standing = [_certificate(sc)]
    free = sc.one(P + "journal_disk_free_bytes", sc.e)
    size = sc.value(sc.one(P + "journal_disk_size_bytes", sc.e))
    # As scraped (the test's tmpfs, mostly free), unless the journal is on a
    # fuller disk (no tmpfs): then from 90% free, so that the crossings below
    # fall within the series.
    f0 = sc.value(free) if sc.value(free) / size > 0.5 else 0.9 * size
    for t in range(MINUTES + 1):
        sc.values[free][t] = max(0.0, f0 * (1 - t / 180))
    # When the free share falls below 25% and 5%.
    quarter = math.ceil(180 * (1 - 0.25 * size / f0))
    twentieth = math.ceil(180 * (1 - 0.05 * size / f0))
    filling = sc.alert("SegmentGatewayJournalDiskFillingUp", "warning", free)
    almost = sc.alert("SegmentGatewayJournalDiskAlmostFull", "warning", free)
    sc.expect(quarter - 5)
    sc.expect(quarter + 17, filling)
    sc.expect(twentieth + 7, filling, almost)


def tier2_down(sc: Scenario) -> None:
    """S3 unreachable: calls and flushes fail, the oldest unflushed byte ages."""
    sc.standing = [_certificate(sc)]
    errors = sc.one(P + "tier2_errors_total", sc.e)
    sc.ramp(errors, 30, 6)
    sc.ramp(sc.one(P + "tier2_flush_failures_total", sc.e), 30, 2)
    sc.step(sc.one(P + "pending_flush_bytes", sc.e), 30, 1 << 20)
    oldest = sc.one(P + "pending_flush_oldest_seconds", sc.e)
    sc.ramp(oldest, 30, 60)
    t2 = sc.alert("SegmentGatewayTier2Errors", "warning", errors)
    sc.expect(35)
    sc.expect(42, t2)
    sc.expect(48, t2, sc.alert("SegmentGatewayFlushBacklog", "warning", oldest))


def embedded_s3_down(sc: Scenario) -> None:
    """SeaweedFS killed and its restarts failing."""
    sc.standing = [_certificate(sc)]
    up = sc.one(P + "embedded_s3_up", sc.e)
    sc.step(up, 30, 0)
    sc.step(sc.one(P + "embedded_s3_state", sc.e, state="up"), 30, 0)
    sc.step(sc.one(P + "embedded_s3_state", sc.e, state="down"), 30, 1)
    sc.step(sc.one(P + "embedded_s3_exits_total", sc.e), 30, 1)
    sc.ramp(sc.one(P + "embedded_s3_restart_attempts_total", sc.e), 30, 1)
    errors = sc.one(P + "tier2_errors_total", sc.e)
    sc.ramp(errors, 30, 10)
    down = sc.alert("SegmentGatewayEmbeddedS3Down", "critical", up)
    sc.expect(29)
    sc.expect(32, down)
    sc.expect(42, down, sc.alert("SegmentGatewayTier2Errors", "warning", errors))


def embedded_s3_restart_loop(sc: Scenario) -> None:
    """SeaweedFS dies every 4 minutes and comes back each time."""
    sc.standing = [_certificate(sc)]
    exits = sc.one(P + "embedded_s3_exits_total", sc.e)
    restarts = sc.one(P + "embedded_s3_restarts_total", sc.e)
    for n, at in enumerate((30, 34, 38, 42), start=1):
        sc.step(exits, at, n)
        sc.step(restarts, at, n)
    sc.expect(35)
    sc.expect(43, sc.alert("SegmentGatewayEmbeddedS3Restarting", "warning", exits))


def mount_read_errors(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    errors = sc.one(P + "fuse_read_errors_total", sc.e)
    sc.step(errors, 30, sc.value(errors) + 1)
    sc.expect(29)
    sc.expect(31, sc.alert("SegmentGatewayMountReadErrors", "critical", errors))
    sc.expect(40)


def cache_thrashing(sc: Scenario) -> None:
    """The embedded node's cache thrashes; node-a's is busy but hits; node-b's fills."""
    sc.standing = [_certificate(sc)]
    for instance, hits, misses, evictions in (
        (sc.e, 30, 120, 120),
        (sc.a, 600, 120, 120),
        (sc.b, 0, 120, 0),
    ):
        sc.ramp(sc.one(P + "cache_hits_total", instance), 30, hits)
        sc.ramp(sc.one(P + "cache_misses_total", instance), 30, misses)
        sc.ramp(sc.one(P + "cache_evictions_total", instance), 30, evictions)
    # The misses' rate passes 1/s at minute 37; then 30 minutes.
    sc.expect(50)
    sc.expect(
        70,
        sc.alert("SegmentGatewayCacheThrashing", "warning", sc.one(P + "cache_misses_total", sc.e)),
    )


def fsck_problems(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    chunks = sc.one(P + "fsck_problems", sc.e, check="chunks")
    sc.step(chunks, 30, 2)
    sc.expect(29)
    sc.expect(31, sc.alert("SegmentGatewayFsckProblems", "warning", chunks, drop=("check",)))


def certificate_expiring(sc: Scenario) -> None:
    """A day left: both severities, after their 10 minutes."""
    sel = sc.one(P + "tls_certificate_expiry_timestamp_seconds", sc.e)
    sc.step(sel, 0, DAY)
    sc.expect(5)
    sc.expect(
        11,
        sc.alert("SegmentGatewayCertificateExpiry", "warning", sel),
        sc.alert("SegmentGatewayCertificateExpiry", "critical", sel),
    )


def certificate_renewed(sc: Scenario) -> None:
    """Twenty days left: no alert."""
    sc.step(sc.one(P + "tls_certificate_expiry_timestamp_seconds", sc.e), 0, 20 * DAY)
    sc.expect(60)


def peer_dies(sc: Scenario) -> None:
    """node-b dies: node-a sees it down, loses its ack quorum and its replica, and
    takes node-b's container over."""
    sc.standing = [_certificate(sc)]
    sc.gone(sc.b, 30)
    down = sc.one(P + "cluster_nodes", sc.a, state="down")
    sc.step(down, 30, 1)
    up_nodes = sc.one(P + "cluster_nodes", sc.a, state="up")
    sc.step(up_nodes, 30, sc.value(up_nodes) - 1)
    quorum = sc.one(P + "replication_quorum", sc.a)
    sc.step(quorum, 30, 0)
    peer_up = sc.one(P + "replication_peer_up", sc.a, peer="node-b")
    sc.step(peer_up, 30, 0)
    lag = sc.one(P + "replication_peer_lag_operations", sc.a, peer="node-b")
    sc.ramp(lag, 30, 200)
    takeovers = sc.one(P + "takeovers_total", sc.a)
    sc.step(takeovers, 31, sc.value(takeovers) + 1)
    node_down = sc.alert("SegmentGatewayNodeDown", "critical", down, drop=("instance",))
    no_quorum = sc.alert("SegmentGatewayBelowAckQuorum", "critical", quorum)
    took = sc.alert("SegmentGatewayTakeover", "warning", takeovers)
    b_down = sc.alert("SegmentGatewayDown", "critical", sc.one("up", sc.b))
    replica_down = sc.alert("SegmentGatewayReplicaDown", "warning", peer_up)
    lagging = sc.alert("SegmentGatewayReplicaLagging", "warning", lag)
    sc.expect(29)
    sc.expect(33, node_down, no_quorum, took, b_down)
    sc.expect(37, node_down, no_quorum, took, b_down, replica_down)
    sc.expect(48, node_down, no_quorum, b_down, replica_down, lagging)


def lease_lost_then_fenced(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    lease = sc.one(P + "cluster_lease_held", sc.a)
    fenced = sc.one(P + "cluster_fenced", sc.a)
    sc.step(lease, 30, 0)
    sc.step(fenced, 40, 1)
    lost = sc.alert("SegmentGatewayLeaseLost", "critical", lease)
    sc.expect(29)
    sc.expect(32, lost)
    sc.expect(41, lost, sc.alert("SegmentGatewayFenced", "critical", fenced))


def takeover_failing(sc: Scenario) -> None:
    sc.standing = [_certificate(sc)]
    failures = sc.one(P + "takeover_failures_total", sc.a)
    sc.step(failures, 30, sc.value(failures) + 1)
    sc.expect(29)
    sc.expect(31, sc.alert("SegmentGatewayTakeoverFailing", "critical", failures))
    sc.expect(50)


SCENARIOS: list[Callable[[Scenario], None]] = [
    as_scraped,
    target_down,
    restarts,
    journal_failed,
    journal_disk_full,
    journal_disk_filling,
    tier2_down,
    embedded_s3_down,
    embedded_s3_restart_loop,
    mount_read_errors,
    cache_thrashing,
    fsck_problems,
    certificate_expiring,
    certificate_renewed,
    peer_dies,
    lease_lost_then_fenced,
    takeover_failing,
]
