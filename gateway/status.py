"""The status page (``GET /`` on the metrics listener) and the node summary.

One read-only HTML page, no script: the node at a glance (the rows of
`gateway.summary`, the same ones ``segment-gateway status`` prints from the
protocol's status request), the longest and the most backlogged segments,
and every node of the cluster with its heartbeat and what it hosts. It is
served where /metrics is, so it is exposed exactly as /metrics is
(``metrics.listen``, loopback by default); it shows no token, key or
credential, only names, sizes and states, each escaped (segment and node
names come from clients and from the bucket).

What a request costs does not grow with the number of segments: the longest
come from `gateway.container.largest` (kept as lengths change), the
backlogged from the storage writer's segments waiting for a flush (the
active ones, as /metrics reads them), the cluster from the registry the node
follows anyway. When deletions left the longest unsure, a recount (a pass
over every segment, in slices of RECOUNT_SLICE with the event loop free
between them) runs in the background, at most once per RECOUNT_INTERVAL.
"""

from __future__ import annotations

import datetime
import logging
import os
import urllib.parse
from collections.abc import Collection, Sequence
from html import escape
from typing import TYPE_CHECKING

import trio
import trio.lowlevel

from gateway import __version__
from gateway.health_metrics import disk_space
from gateway.protocol import wire_pb2 as wire
from gateway.summary import Row, duration, rows, size

if TYPE_CHECKING:
    from gateway.container.segment import Segment
    from gateway.metrics import GatewayCollector

log = logging.getLogger(__name__)

#: Segments each of the page's two tables shows.
TOP = 20
#: Seconds between recounts of the longest segments, at least.
RECOUNT_INTERVAL = 60.0
#: Segments read per slice of a recount (~10 ms at ~5 us a cold record).
RECOUNT_SLICE = 2000
#: Characters of a flush error the page shows.
ERROR_CHARS = 300


class StatusPage:
    """The summary and the page of one node, read from the parts a `GatewayCollector` has."""

    def __init__(self, collector: GatewayCollector) -> None:
        self.collector = collector
        #: trio time this run opened the node (the uptime counts from here).
        self.started = trio.current_time()
        #: Set when a page found the longest segments unsure (`run` recounts).
        self._recount_wanted = trio.Event()
        #: Pages served.
        self.pages = 0

    # -- the summary ---------------------------------------------------------------

    async def summary(self) -> wire.NodeSummary:
        """The node now (the status request's answer and the page's first table)."""
        c = self.collector
        node = c.node
        config = node.config
        container = node.container
        j = container.journal_statistics()
        cache = node.store.statistics()
        s = wire.NodeSummary(
            node=config.node.id,
            version=__version__,
            epoch=j.epoch,
            uptime_s=trio.current_time() - self.started,
            segments=container.segment_count,
            sealed_segments=container.sealed_count,
            cold_segments=container.cold_segments,
            journal_bytes=j.disk_bytes,
            journal_files=j.files,
            journal_failed=str(j.failed) if j.failed else "",
            journal_short_of_space=j.short_of_space,
            journal_refusals=j.refusals,
            cache_pinned_bytes=cache.pinned_bytes,
            cache_journal_bytes=node.read_index.located_bytes,
            cache_block_bytes=cache.block_bytes,
            cache_budget_bytes=cache.budget_bytes,
            cache_hits=cache.hits,
            cache_misses=cache.misses,
            mountpoint=config.fuse.mountpoint,
        )
        disk = await trio.to_thread.run_sync(disk_space, str(config.journal_dir))
        if disk is not None:
            s.journal_disk_bytes, s.journal_disk_free_bytes = disk
        writer = node.storage_writer
        if writer is not None:
            s.tier2 = public_url(config.tier2.url)
            w = writer.statistics()
            s.tier2_unflushed_bytes = w.unflushed_bytes
            s.tier2_unflushed_segments = w.unflushed_segments
            s.tier2_oldest_unflushed_s = writer.oldest_unflushed_age()
            s.tier2_errors = writer.layer.statistics().failures
            s.tier2_flush_failures = w.flush_failures
            s.tier2_failing_segments = sum(1 for b in writer.backlog() if b[2])
            if writer.layer.embedded is not None:
                e = writer.layer.embedded.statistics()
                s.embedded_s3 = e.state
                s.embedded_s3_exits, s.embedded_s3_restarts = e.exits, e.restarts
        if c.fs is not None:
            fs = c.fs.statistics()
            s.fuse_read_errors, s.fuse_open_files = fs["read_errors"], fs["open_files"]
        if config.fuse.mountpoint:
            s.mounted = await trio.to_thread.run_sync(_mounted, config.fuse.mountpoint)
        view = c.cluster
        if view is not None and config.tier2.url != "embedded":
            s.cluster = True
            s.lease_held = view.lease.held()
            s.fenced = view.fenced is not None
        return s

    # -- the page ------------------------------------------------------------------

    async def render(self) -> bytes:
        """The whole page, as UTF-8 HTML."""
        summary = await self.summary()
        largest, exact = self._largest()
        parts = [
            _HEAD.format(title=escape(f"segment-gateway {summary.node}")),
            f"<h1>segment-gateway <span class=node>{escape(summary.node)}</span></h1>\n",
            f"<p class=sub>version {escape(summary.version)} &middot; "
            f'{escape(_now())} &middot; <a href="/metrics">/metrics</a></p>\n',
            "<h2>Node</h2>\n",
            _rows_table(rows(summary)),
            f"<h2>Largest segments</h2>\n{largest}",
        ]
        if not exact:
            parts.append("<p class=note>Segments were deleted since this ranking was made: "
                         "it is being recounted, and may miss some until then.</p>\n")  # fmt: skip
        parts += [f"<h2>Most backlogged segments</h2>\n{self._backlog()}"]
        parts += [f"<h2>Cluster</h2>\n{self._cluster()}", "</body>\n</html>\n"]
        self.pages += 1
        return "".join(parts).encode()

    async def answer(self, stream: trio.abc.Stream, head_only: bool) -> None:
        """Send the page as an HTTP answer (the metrics listener's connection)."""
        body = await self.render()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            # No script runs here, whatever a name holds, and nothing is framed.
            "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; "
            "frame-ancestors 'none'; form-action 'none'\r\n"
            "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
            "Connection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + (b"" if head_only else body))

    def _largest(self) -> tuple[str, bool]:
        container = self.collector.node.container
        ranked, exact = container.largest.top(TOP)
        if not exact:
            self._recount_wanted.set()
        out = []
        for seg_id, length in ranked:
            seg = container.segment_by_id(seg_id)
            if seg is not None:
                out.append((seg.name, size(length), *_state(seg)))  # name: eager, stays cold
        return _table(("segment", "length", "state", "not in Tier 2"), out), exact

    def _backlog(self) -> str:
        writer = self.collector.node.storage_writer
        if writer is None:
            return "<p>No Tier 2.</p>\n"
        container = self.collector.node.container
        waiting = []
        for seg_id, age, failures, error in writer.backlog():
            seg = container.segment_by_id(seg_id)
            if seg is not None and not seg.cold:
                unflushed = max(0, seg.length - max(seg.storage_length, seg.start_offset))
                waiting.append((unflushed, age, failures, error, seg))
        waiting.sort(key=lambda w: (w[0], w[1]), reverse=True)
        rows_ = [
            (seg.name, size(unflushed), duration(age), str(failures) if failures else "",
             error[:ERROR_CHARS])
            for unflushed, age, failures, error, seg in waiting[:TOP]
        ]  # fmt: skip
        more = f"<p>And {len(waiting) - TOP:,} more.</p>\n" if len(waiting) > TOP else ""
        return _table(("segment", "not in Tier 2", "oldest", "failed flushes", "last error"),
                      rows_) + more  # fmt: skip

    def _cluster(self) -> str:
        c = self.collector
        view = c.cluster
        nodes = view.status() if view is not None else []
        if len(nodes) <= 1 and (view is None or c.node.config.tier2.url == "embedded"):
            return "<p>This node alone (no other node shares its Tier 2).</p>\n"
        hosts: dict[str, list[str]] = {}
        for n in nodes:
            if n.hosted_by:
                hosts.setdefault(n.hosted_by, []).append(n.id)
        replicas_of = sorted(c.replicas.statistics().sources) if c.replicas is not None else []
        ensemble = list(c.replicator.members) if c.replicator is not None else []
        out = []
        for n in nodes:
            age = "this node" if n.self else duration(n.heartbeat_age_ms / 1000) + " ago"
            held = ", ".join(replicas_of) if n.self else ""
            out.append((
                n.id + (" (this node)" if n.self else ""), n.state, n.advertise, age,
                str(n.epoch), n.version, f"{n.segments:,}", size(n.unflushed_bytes),
                ", ".join(hosts.get(n.id, [])), n.hosted_by, held,
                ", ".join(ensemble) if n.self else "",
            ))  # fmt: skip
        header = ("node", "state", "address", "heartbeat", "epoch", "version", "segments",
                  "unflushed", "hosts the containers of", "runs on", "holds replicas of",
                  "replicated to")  # fmt: skip
        bad = {i for i, n in enumerate(nodes) if n.state != "up" and n.state != "stopped"}
        return _table(header, out, bad)

    # -- the background recount --------------------------------------------------------

    async def run(self) -> None:
        """Recount the longest segments when a page found them unsure (forever)."""
        while True:
            await self._recount_wanted.wait()
            self._recount_wanted = trio.Event()
            await self.recount()
            await trio.sleep(RECOUNT_INTERVAL)

    async def recount(self) -> None:
        """One pass over every segment's length, a slice at a time."""
        container = self.collector.node.container
        started = trio.current_time()
        recount = container.largest.begin_recount()
        segments = container.segments()
        for i in range(0, len(segments), RECOUNT_SLICE):
            recount.feed(segments[i : i + RECOUNT_SLICE])
            await trio.lowlevel.checkpoint()
        recount.finish(container.segment_by_id)
        log.info("status: recounted the longest of %d segment(s) in %.1fs", recount.seen,
                 trio.current_time() - started)  # fmt: skip


def public_url(url: str) -> str:
    """``tier2.url`` without what must not be shown: user, password, query, fragment."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` is a mount in this process's namespace.

    Read from /proc/self/mountinfo: a stat of the mountpoint would be answered
    by this very process's FUSE loop (or hang on a dead mount).
    """
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4 and _unescape(fields[4]) == target:
            return True
    return False


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _state(seg: Segment) -> tuple[str, str]:
    """(state, bytes not in Tier 2) without warming a cold segment."""
    if seg.cold:
        return "sealed, in Tier 2 (cold)", size(0)
    unflushed = max(0, seg.length - max(seg.storage_length, seg.start_offset))
    return ("sealed" if seg.sealed else "active"), size(unflushed)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rows_table(summary_rows: list[Row]) -> str:
    out = ["<table class=kv>\n"]
    for r in summary_rows:
        cls = " class=bad" if r.attention else ""
        out.append(f"<tr{cls}><th>{escape(r.label)}</th><td>{escape(r.text)}</td></tr>\n")
    out.append("</table>\n")
    return "".join(out)


def _table(
    header: tuple[str, ...], body: Sequence[tuple[str, ...]], bad: Collection[int] = ()
) -> str:
    """A table; every cell escaped. None at all: a line saying so."""
    if not body:
        return "<p>None.</p>\n"
    out = ["<table>\n<tr>", *(f"<th>{escape(h)}</th>" for h in header), "</tr>\n"]
    for i, row in enumerate(body):
        out.append("<tr class=bad>" if i in bad else "<tr>")
        out.extend(f"<td>{escape(cell)}</td>" for cell in row)
        out.append("</tr>\n")
    out.append("</table>\n")
    return "".join(out)


_HEAD = """<!doctype html>
<html lang=en>
<head>
<meta charset=utf-8>
<meta name=viewport content="width=device-width, initial-scale=1">
<meta name=robots content=noindex>
<title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1f23; }}
h1 {{ font-size: 1.4em; margin: 0; }} h2 {{ font-size: 1.1em; margin: 1.4em 0 .4em; }}
.node {{ color: #0550ae; }} .sub, .note {{ color: #57606a; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid #d0d7de;
  vertical-align: top; }}
td {{ font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }}
table.kv th {{ width: 8em; }}
tr.bad td, tr.bad th {{ color: #cf222e; font-weight: 600; }}
</style>
</head>
<body>
"""
