"""Series the alerting rules need that no component counts (`gateway.metrics` serves them).

packaging/monitoring/alerts.yml pages on a journal disk that is filling up,
on a served certificate close to its expiry and on problems an online fsck
left: the free space of the journal's file system (one ``statvfs`` per
scrape: a local disk answers in microseconds), the earliest ``notAfter`` of
the certificates in ``server.tls_cert`` as the server loaded them at its
start (`gateway.server.Server.certificate_expiry`: it reads the file at
start only), and what the last online fsck left
(`gateway.fsck.report.FsckRecord`).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.fsck.report import CHECKS

if TYPE_CHECKING:
    from gateway.server import Server

PREFIX = "segment_gateway"


def disk_space(path: str) -> tuple[int, int] | None:
    """(size, bytes the daemon may still use) of the file system holding ``path``;
    None if it cannot be asked (the metrics and the status page show the same)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def health_families(journal_dir: pathlib.Path, server: Server | None) -> Iterator[Metric]:
    """This scrape's journal disk space, certificate expiry and fsck findings
    (``server``: the protocol server, None before it is made)."""
    g = GaugeMetricFamily
    disk = disk_space(str(journal_dir))
    if disk is not None:  # None: gone or unreachable, the journal's own errors say so
        size, free = disk
        yield g(
            f"{PREFIX}_journal_disk_free_bytes",
            "Space the daemon may still use on the journal's file system",
            value=free,
        )
        yield g(
            f"{PREFIX}_journal_disk_size_bytes", "Size of the journal's file system", value=size
        )
    if server is None:
        return
    if server.certificate_expiry is not None:
        yield g(
            f"{PREFIX}_tls_certificate_expiry_timestamp_seconds",
            "When the first of the served certificates (server.tls_cert, as loaded at start) "
            "expires, Unix time",
            value=server.certificate_expiry,
        )
    fsck = server.fsck_record
    yield CounterMetricFamily(
        f"{PREFIX}_fsck_runs", "Online fsck runs that completed in this daemon", value=fsck.runs
    )
    problems = g(
        f"{PREFIX}_fsck_problems",
        "Problems the last completed online fsck found and did not repair, by check",
        labels=["check"],
    )
    for check in CHECKS:
        if check != "journal":  # the command checks the journal's files itself
            problems.add_metric([check], fsck.problems.get(check, 0))
    yield problems
    if fsck.last_run is not None:
        yield g(
            f"{PREFIX}_fsck_last_run_timestamp_seconds",
            "When the last completed online fsck ended, Unix time",
            value=fsck.last_run,
        )
