"""Logging: journald priority prefixes, and secrets never reach a log line."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys

import pytest

from gateway import logs
from gateway.client.sync import SyncClient
from gateway.embedded import EmbeddedS3
from gateway.storage.s3 import S3Storage
from tests.helpers.daemon import Daemon

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Daemons, SeaweedFS or Spark: `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

EMIT = """
import logging, sys
from gateway import logs
logs.setup(logging.DEBUG)
logging.getLogger("demo").info("hello")
logging.getLogger("demo").error("bad\\nsecond line")
logging.getLogger("demo").debug("token is %s", "hunter2-token")
"""


def run_emitter(env: dict[str, str]) -> str:
    r = subprocess.run(
        [sys.executable, "-c", EMIT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_plain_lines_have_timestamps_and_levels() -> None:
    out = run_emitter({"JOURNAL_STREAM": ""})
    first = out.splitlines()[0]
    assert first.endswith("INFO demo: hello") and first[:4].isdigit()


def test_journal_stream_gets_priority_prefixes(tmp_path: pathlib.Path) -> None:
    # stderr is a file here; JOURNAL_STREAM names it, as systemd names its stream.
    path = tmp_path / "stderr"
    with open(path, "w") as f:
        st = os.fstat(f.fileno())
        r = subprocess.run(
            [sys.executable, "-c", EMIT],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}",
                "SEGMENT_GATEWAY_TOKEN": "hunter2-token",
            },
            stderr=f,
            timeout=30,
        )
    assert r.returncode == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "<6>demo: hello"
    assert lines[1:3] == ["<3>demo: bad", "<3>second line"]
    assert lines[3] == "<7>demo: token is ***"
    # A JOURNAL_STREAM that is not our stderr (inherited by a child) is ignored.
    assert run_emitter({"JOURNAL_STREAM": "1:2"}).splitlines()[0][:4].isdigit()


def test_redact_filter_covers_arguments_and_tracebacks() -> None:
    f = logs.RedactSecrets(["s3cr3t-value", "xy"])
    record = logging.LogRecord("n", logging.ERROR, "p", 1, "key=%s", ("s3cr3t-value",), None)
    try:
        raise RuntimeError("failed with s3cr3t-value")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert f.filter(record)
    assert record.getMessage() == "key=***"
    assert record.exc_text is not None and "s3cr3t-value" not in record.exc_text
    assert "xy" not in f.secrets  # too short to be worth hiding


@pytest.mark.timeout(120)
def test_daemon_log_holds_no_token_or_s3_secret(
    tmp_path: pathlib.Path, seaweedfs: EmbeddedS3, s3_storage: S3Storage
) -> None:
    token = "tok-" + "7" * 24
    config = (
        f'[server]\ntoken = "{token}"\n[logging]\nlevel = "debug"\n'
        f'[tier2]\nurl = "s3://{s3_storage.bucket}/p"\nendpoint_url = "{seaweedfs.endpoint_url}"\n'
    )
    env = {"AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    daemon = Daemon(tmp_path / "node", config, env=env)
    daemon.start(timeout=60)
    try:
        with SyncClient(daemon.address, token=token) as c:
            c.create("l/s")
            c.append("l/s", b"x" * 1000)
            c.flush("l/s")
        with (
            pytest.raises(Exception, match=r"(?i)token|unauthori"),
            SyncClient(daemon.address, token="wrong-" + token) as c,
        ):
            c.info("l/s")
    finally:
        daemon.stop()
    text = daemon.log_path.read_text()
    assert "DEBUG" in text  # debug logging was on
    assert token not in text
    assert seaweedfs.secret_key not in text
