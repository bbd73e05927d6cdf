"""The status page (``GET /`` on the metrics listener) and ``segment-gateway status``
of one real daemon: mounted, Tier 2 in its embedded SeaweedFS, a token and TLS
on the protocol, and in its bucket another node's registry record whose
fields hold HTML. Read over plain HTTP, by the command line, and by a real
browser (Debian's headless Chromium)."""

from __future__ import annotations

import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trustme

from gateway.client.sync import SyncClient
from gateway.embedded.security import load_or_create_identity
from gateway.storage.s3 import S3Storage
from tests.helpers.cluster import record
from tests.helpers.mount import MountedDaemon, require_fuse
from tests.helpers.wait import wait_for

from .conftest import ROOT

# A daemon with its embedded S3 server, a mount and a browser: `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

TOKEN = "status-page-token-9f3c1e"
#: What another node's record in the bucket says of it: HTML where text goes.
HOSTILE_VERSION = '<script>alert("v")</script>'
HOSTILE_HOST = "<img src=x onerror=alert(1)>&amp;"
#: The segments, each 1 KiB longer than the one before; the last one is left unflushed.
SIZES = {f"status/s{i:02d}": 1024 * (i + 1) for i in range(25)}
BACKLOGGED = "status/tail"


@dataclass
class Node:
    daemon: MountedDaemon
    ca: pathlib.Path
    secrets: list[str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SEGMENT_GATEWAY_")}
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", args[0], "--connect", self.daemon.address,
             "--token", TOKEN, "--tls-ca", str(self.ca), *args[1:]],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.daemon.metrics_port}/"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    require_fuse()
    base = tmp_path_factory.mktemp("status")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    pki = base / "pki"
    pki.mkdir()
    cert.cert_chain_pems[0].write_to_path(str(pki / "cert.pem"))
    cert.private_key_pem.write_to_path(str(pki / "key.pem"))
    ca.cert_pem.write_to_path(str(pki / "ca.pem"))
    config = (
        f'[server]\ntoken = "{TOKEN}"\ntls_cert = "{pki / "cert.pem"}"\n'
        f'tls_key = "{pki / "key.pem"}"\n'
        # Nothing flushes by itself: the backlog stays what the test made it.
        '[tier2]\nurl = "embedded"\nflush_interval = "1h"\n'
    )
    daemon = MountedDaemon(base / "node", base / "mnt", config_text=config)
    try:
        daemon.start(timeout=90)
        with SyncClient(daemon.address, TOKEN, tls_ca=str(pki / "ca.pem")) as c:
            for name, size in SIZES.items():
                c.create(name)
                c.append(name, b"s" * size)
            c.flush("")
            c.create(BACKLOGGED)
            c.append(BACKLOGGED, b"t" * 3000)
        # Another node's record in the bucket, as any process that can write there
        # may leave it: the page must show its text as text.
        access, secret = load_or_create_identity(daemon.data_dir / "s3")
        found = re.search(r"-s3\.port=(\d+)", daemon.log())
        assert found, daemon.log()
        bucket = S3Storage("segment-gateway", endpoint_url=f"http://127.0.0.1:{found[1]}",
                           access_key=access, secret_key=secret)  # fmt: skip
        try:
            bucket.write("_cluster/nodes/node-x.json", record(
                "node-x", "127.0.0.1:1", int(time.time() * 1000), version=HOSTILE_VERSION,
                hosted_by=HOSTILE_HOST), {})  # fmt: skip
        finally:
            bucket.close()
        node = Node(daemon, pki / "ca.pem", [TOKEN, str(pki / "key.pem"), access, secret])
        wait_for(lambda: "node-x" in fetch(node.url)[1], 30, "the page showing node-x")
        yield node
    finally:
        daemon.teardown()


def fetch(url: str, method: str = "GET") -> tuple[dict[str, str], str]:
    """(headers, body) of a request to the page."""
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
        return dict(r.headers), r.read().decode()


class _Tables(html.parser.HTMLParser):
    """The text of every table on a page, by the heading before it: rows of cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._heading = ""
        self._in: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in ("h2", "td", "th"):
            self._in, self._text = tag, ""
        elif tag == "tr":
            self.tables.setdefault(self._heading, []).append([])

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self._in == "h2":
            self._heading = self._text
        elif tag in ("td", "th") and self._in == tag:
            self.tables[self._heading][-1].append(self._text)
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self._text += data


def tables(body: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(body)
    return parser.tables


@pytest.mark.timeout(120)
def test_the_page_shows_the_node_its_segments_and_the_cluster_escaped(node: Node) -> None:
    headers, body = fetch(node.url)
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none'
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    t = tables(body)

    summary = {row[0]: row[1] for row in t["Node"]}
    assert summary["node"].startswith("node-1: segment-gateway ")
    assert summary["segments"] == f"{len(SIZES) + 1} (0 sealed, 0 cold)"
    assert summary["mount"] == f"{node.daemon.mnt}: mounted; 0 file(s) open"
    assert summary["embedded S3"] == "up; 0 exit(s), 0 restart(s)"
    assert summary["tier 2"].startswith("embedded: 2.9 KiB unflushed in 1 segment(s)")

    largest = t["Largest segments"]
    assert largest[0] == ["segment", "length", "state", "not in Tier 2"]
    expected = sorted(SIZES, key=SIZES.__getitem__, reverse=True)[:20]
    assert [row[0] for row in largest[1:]] == expected
    assert largest[1][1:] == ["25.0 KiB", "active", "0 B"]

    backlog = t["Most backlogged segments"]
    assert [row[:2] for row in backlog[1:]] == [[BACKLOGGED, "2.9 KiB"]]

    cluster = {row[0]: row for row in t["Cluster"][1:]}
    assert set(cluster) == {"node-1 (this node)", "node-x"}
    header = t["Cluster"][0]
    other = dict(zip(header, cluster["node-x"], strict=True))
    # Shown as the text it is, never as markup.
    assert other["version"] == HOSTILE_VERSION and other["runs on"] == HOSTILE_HOST
    assert "<script" not in body and "<img" not in body
    assert "&lt;script&gt;" in body and "&amp;amp;" in body
    assert other["heartbeat"].endswith(" ago") and other["address"] == "127.0.0.1:1"

    # Nothing secret: not the token, the TLS key's path, or the S3 credentials.
    for secret in node.secrets:
        assert secret not in body

    # Read-only: HEAD answers the headers alone; nothing else is taken.
    headers, empty = fetch(node.url, "HEAD")
    assert empty == "" and int(headers["Content-Length"]) > 1000
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(node.url, b"x=1", method="POST"), timeout=10)
    assert e.value.code == 405
    e.value.close()


@pytest.mark.timeout(120)
def test_status_prints_the_rows_of_the_page(node: Node) -> None:
    r = node.cli("status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    labels = [line[2:].split("  ")[0].strip() for line in lines]
    assert labels == ["node", "segments", "journal", "cache", "tier 2", "mount", "embedded S3"]
    assert all(line.startswith("  ") for line in lines)  # nothing marked "!"
    page = {row[0]: row[1] for row in tables(fetch(node.url)[1])["Node"]}
    for line, label in zip(lines, labels, strict=True):
        text = line[2:].removeprefix(label).strip()
        if label not in ("node", "tier 2", "journal", "cache"):  # those hold ages and sizes
            assert page[label] == text

    r = node.cli("status", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node"] == "node-1" and doc["segments"] == len(SIZES) + 1
    assert doc["mounted"] is True and doc["embedded_s3"] == "up" and doc["tier2"] == "embedded"
    assert doc["tier2_unflushed_bytes"] == 3000 and doc["tier2_unflushed_segments"] == 1
    assert doc["journal_disk_bytes"] > doc["journal_disk_free_bytes"] > 0
    for secret in node.secrets:
        assert secret not in r.stdout

    # Without the token: refused like every other request.
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "status", "--connect", node.daemon.address,
         "--tls-ca", str(node.ca)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SEGMENT_GATEWAY_")},
    )  # fmt: skip
    assert r.returncode == 19 and "unauthorized" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_a_browser_renders_the_page(node: Node, tmp_path: pathlib.Path) -> None:
    """Debian's Chromium, headless: the DOM it built, and a screenshot kept with the test."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium (scripts/bootstrap.sh installs it)")
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    r = subprocess.run([*browser, "--dump-dom", node.url], capture_output=True, text=True,
                       timeout=90)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    assert "<title>segment-gateway node-1</title>" in dom
    t = tables(dom)
    assert list(t) == ["Node", "Largest segments", "Most backlogged segments", "Cluster"]
    assert t["Largest segments"][1][0] == "status/s24"
    assert t["Most backlogged segments"][1][0] == BACKLOGGED
    # The browser ran no script from a record (none could have changed the DOM).
    other = next(row for row in t["Cluster"] if row[0] == "node-x")
    assert HOSTILE_VERSION in other and HOSTILE_HOST in other

    shot = tmp_path / "status-page.png"
    r = subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1280,1400", node.url],
                       capture_output=True, text=True, timeout=90)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1280, 1400) and len(png) > 20_000  # not a blank page
