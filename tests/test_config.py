"""Configuration parsing: defaults, units, and errors that name the key."""

from __future__ import annotations

import math
import pathlib
import re
import signal
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.client.sync import SyncClient
from gateway.config import Config, all_keys, parse_duration, parse_host_port, parse_size
from gateway.errors import ConfigError
from tests.helpers.daemon import run_cli
from tests.helpers.wait import wait_for

from .conftest import ROOT


def test_empty_file_gives_defaults(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("")
    c = Config.load(path)
    assert c == Config()
    assert c.node.id == "node-1"
    assert c.server.listen == "127.0.0.1:9410"
    assert c.journal.max_frame_bytes == 1024 * 1024
    assert c.journal_dir == pathlib.Path("/var/lib/segment-gateway/journal")


def test_full_file_with_units(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        """
[node]
id = "node-7"
data_dir = "/data/sg"
[server]
listen = "[::1]:9500"
[fuse]
mountpoint = ""
[tier2]
url = "s3://my-bucket/some/prefix"
endpoint_url = "http://127.0.0.1:8333"
[metrics]
listen = "127.0.0.1:9501"
[logging]
level = "debug"
[journal]
file_size = "128 MiB"
preallocate_step = "16MiB"
max_frame_bytes = 524288
max_group_bytes = "4MiB"
group_commit_wait = "2ms"
checkpoint_every_frames = 100
"""
    )
    c = Config.load(path)
    assert c.node.id == "node-7"
    assert c.journal_dir == pathlib.Path("/data/sg/journal")
    assert c.journal.file_size == 128 * 1024 * 1024
    assert c.journal.max_frame_bytes == 512 * 1024
    assert c.journal.group_commit_wait == pytest.approx(0.002)
    assert c.fuse.mountpoint == ""
    assert c.tier2.url == "s3://my-bucket/some/prefix"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[node]\nid = 'a b'\n", "node.id: must be 1-64 characters"),
        ("[node]\nnope = 1\n", "node.nope: unknown key"),
        ("[node]\nid = '_cluster'\n", "node.id: must be 1-64 characters"),
        ("[node]\nadvertise = '0.0.0.0:9410'\n", "node.advertise: must be an address other nodes"),
        ("[node]\nadvertise = '10.0.0.1:0'\n", "node.advertise: must name the port"),
        ("[node]\nadvertise = 'host'\n", "node.advertise: expected HOST:PORT"),
        ("[cluster]\nrefresh_interval = '5min'\n", "cluster.refresh_interval: must be between"),
        ("[cluster]\ntls_ca = '/etc/ca.pem'\n", "cluster.tls_ca: set without server.tls_cert"),
        ("[cluster]\ntls_ca = 'ca.pem'\n", "cluster.tls_ca: must be an absolute path"),
        (
            "[cluster]\nheartbeat_interval = '10s'\n",
            "cluster.down_after: 15s is less than twice cluster.heartbeat_interval (10s)",
        ),
        ("[nope]\nx = 1\n", "nope: unknown section"),
        ("node = 3\n", "node: must be a table"),
        ("[server]\nlisten = 'localhost'\n", "server.listen: expected HOST:PORT"),
        ("[server]\nlisten = '1.2.3.4:99999'\n", "server.listen: port 99999 is out of range"),
        ("[server]\nlisten = 9410\n", "server.listen: expected a string"),
        ("[tier2]\nurl = 's3://ab'\n", "tier2.url: bucket 'ab' is not a valid S3 bucket name"),
        ("[tier2]\nurl = 'http://x'\n", "tier2.url: must be 'embedded'"),
        ("[tier2]\nendpoint_url = 'ftp://x'\n", "tier2.endpoint_url: must be an http(s):// URL"),
        ("[fuse]\nmountpoint = 'mnt'\n", "fuse.mountpoint: must be an absolute path"),
        ("[fuse]\nowner = 'no-such-user-x'\n", "fuse.owner: no user named 'no-such-user-x'"),
        ("[fuse]\ngroup = 'no-such-group-x'\n", "fuse.group: no group named"),
        ("[fuse]\nactive_timeout = 2\n", "fuse.active_timeout: must be between 0s and 1s"),
        ("[fuse]\nallow_other = 'yes'\n", "fuse.allow_other: expected true or false"),
        ("[fuse]\nprefetch_memory = '1 MiB'\n", "fuse.prefetch_memory: must be between"),
        ("[logging]\nlevel = 'loud'\n", "logging.level: must be one of debug, info"),
        ("[journal]\nfile_size = '12 parsecs'\n", "journal.file_size: cannot read '12 parsecs'"),
        ("[journal]\nfile_size = -5\n", "journal.file_size: size must not be negative"),
        ("[journal]\nfile_size = true\n", "journal.file_size: expected a size"),
        ("[journal]\nfile_size = '1 KiB'\n", "journal.file_size: must be between"),
        ("[journal]\ngroup_commit_wait = '5s'\n", "journal.group_commit_wait: must be between"),
        ("[journal]\ncheckpoint_every_frames = 0\n", "journal.checkpoint_every_frames: must be"),
        (
            "[journal]\nmax_frame_bytes = '16MiB'\n",
            "journal.max_frame_bytes: 16777216 exceeds journal.max_group_bytes",
        ),
        (
            "[journal]\nmax_operation_bytes = '512MiB'\n",
            "journal.max_operation_bytes: 536870912 exceeds journal.file_size",
        ),
        (
            "[server]\nlisten = '127.0.0.1:1'\n[metrics]\nlisten = '127.0.0.1:1'\n",
            "metrics.listen: same address as server.listen",
        ),
        (
            "[server]\nlisten = '0.0.0.0:9500'\n[metrics]\nlisten = '127.0.0.1:9500'\n",
            "metrics.listen: same address as server.listen",
        ),
        ("[server]\nmax_memory = '16 MiB'\n", "server.max_memory: 16777216 is less than"),
        ("[server]\nmax_memory = '1 KiB'\n", "server.max_memory: must be between"),
        ("[server]\nmessage_timeout = 0\n", "server.message_timeout: must be between"),
        ("[server]\nsend_timeout = 'soon'\n", "server.send_timeout: cannot read 'soon'"),
        ("[server]\nmemory_timeout = -1\n", "server.memory_timeout: duration must not be"),
        ("[node\n", "file: not valid TOML"),
        (
            "[tier2]\nurl = 's3://bucket/p'\n[replication]\nwrite_quorum = 3\nack_quorum = 4\n",
            "replication.ack_quorum: 4 is above replication.write_quorum (3)",
        ),
        ("[replication]\nwrite_quorum = 3\n", "replication.write_quorum: 3 needs other nodes"),
        ("[replication]\nwrite_quorum = 0\n", "replication.write_quorum: must be between"),
        ("[replication]\nack_timeout = 'never'\n", "replication.ack_timeout: cannot read"),
        ("[replication]\nquorum = 2\n", "replication.quorum: unknown key"),
    ],
)
def test_bad_values_name_the_key(tmp_path: pathlib.Path, toml: str, expected: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert any(expected in e for e in info.value.errors), info.value.errors
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("server", "metrics"),
    [("127.0.0.1:0", "127.0.0.1:0"), ("127.0.0.1:9410", "127.0.0.1:9411"), ("[::1]:0", "")],
)
def test_listeners_that_cannot_collide_are_accepted(server: str, metrics: str) -> None:
    c = Config.from_dict({"server": {"listen": server}, "metrics": {"listen": metrics}})
    assert (c.server.listen, c.metrics.listen) == (server, metrics)


@pytest.mark.timeout(60)
def test_serve_on_port_zero_for_both_listeners(tmp_path: pathlib.Path) -> None:
    """Port 0 means any free port: two of them are not "the same address" (issue item 12)."""
    config = tmp_path / "gateway.toml"
    config.write_text(f'[tier2]\nurl = "file://{tmp_path}/tier2"\n')
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "--config", str(config), "serve",
         "--data-dir", str(tmp_path / "node"), "--mountpoint", "", "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--ready-file", str(ready)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 30, "serve ready or exited")
        assert ready.exists(), "serve did not start"
        address = ready.read_text().strip()
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        with SyncClient(address) as c:
            c.create("port-zero")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "same address" not in out
    assert "metrics on http://127.0.0.1:" in out


def test_all_errors_are_reported_together(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[node]\nid = ''\nextra = 1\n[journal]\nfile_size = 'x'\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert len(info.value.errors) == 3


def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "absent.toml")


def test_units() -> None:
    assert parse_size("64 MiB") == 64 * 1024 * 1024
    assert parse_size("1GB") == 10**9
    assert parse_size("512kib") == 512 * 1024
    assert parse_size(4096) == 4096
    assert parse_duration("2ms") == pytest.approx(0.002)
    assert parse_duration("5min") == 300
    assert parse_duration(1.5) == 1.5
    assert parse_host_port("[::1]:80") == ("::1", 80)
    assert parse_host_port("host.example:0") == ("host.example", 0)


def test_check_config_cli(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[node]\nid = 'n1'\n")
    r = run_cli("check-config", str(good))
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text("[node]\nid = 'n 1'\n[journal]\nmax_frame_bytes = 'lots'\n")
    r = run_cli("check-config", str(bad))
    assert r.returncode == 2
    assert "node.id:" in r.stderr
    assert "journal.max_frame_bytes:" in r.stderr
    assert "Traceback" not in r.stderr

    r = run_cli("--config", str(good), "check-config")
    assert r.returncode == 0


def test_config_md_lists_every_key() -> None:
    text = (ROOT / "docs" / "CONFIG.md").read_text()
    missing = [k for k in all_keys() if f"`{k.split('.', 1)[1]}`" not in text]
    assert not missing, f"docs/CONFIG.md does not document: {missing}"
    for section in {k.split(".")[0] for k in all_keys()}:
        assert f"[{section}]" in text


# -- no value, however wrong, gives anything but a one-line error naming its key ----------

#: Numbers as text: huge, fractional, signed, exponents, non-ASCII digits.
_NUMBER_TEXT = st.one_of(
    st.integers(min_value=0, max_value=10**60).map(str),
    st.sampled_from(
        [
            "1" + "0" * 400,
            "9" * 5000,
            "0.5",
            "1.",
            ".5",
            "1e3",
            "1e400",
            "-1",
            "+1",
            "nan",
            "inf",
            "-inf",
            "²",
            "٣",
            "\uff11\uff12",  # fullwidth digits
            "0x10",
            "1_000",
            "",
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)
_UNIT_TEXT = st.sampled_from(
    ["", "b", "KiB", "kib", "MB", "gib", "TiB", "PiB", "ms", "us", "s", "min", "h", "d", "µs",
     "parsecs", "KİB", "ﬀ", " ", "\t"]
)  # fmt: skip
#: Anything a TOML document can hold for one key (and what tomllib makes of it).
CONFIG_VALUES = st.one_of(
    st.builds(
        lambda n, sp, u: f"{n}{sp}{u}", _NUMBER_TEXT, st.sampled_from(["", " ", "  "]), _UNIT_TEXT
    ),
    st.text(max_size=40),
    st.integers(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([2**63 - 1, 2**64, -(2**63), 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.datetimes(),
)


def _config_errors(key: str, value: object) -> list[str]:
    """Every error of a configuration that sets only ``key`` (none: it is accepted)."""
    section, name = key.split(".", 1)
    try:
        config = Config.from_dict({section: {name: value}}, check_files=False)
    except ConfigError as e:
        return e.errors
    parsed = getattr(getattr(config, section), name)
    # Accepted: a value the daemon can use as it is.
    if isinstance(parsed, float):
        assert math.isfinite(parsed), (key, value, parsed)
    if isinstance(parsed, str):
        assert "\0" not in parsed, (key, value)
    return []


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(all_keys()), value=CONFIG_VALUES)
@example(key="streams.roll_size", value="1" + "0" * 400)
@example(key="streams.roll_size", value="9" * 5000)
@example(key="tier2.flush_size", value="99999999999999999999999 TiB")
@example(key="streams.roll_age", value="300000000000d")
@example(key="streams.roll_age", value=math.nan)
@example(key="server.memory_timeout", value=-math.inf)
@example(key="cache.budget", value="1" + "0" * 400)
@example(key="fuse.owner", value="²")
@example(key="fuse.group", value="99999999999")
@example(key="node.data_dir", value="/var/lib/a\0b")
def test_any_value_of_any_key_is_accepted_or_refused_in_one_line_naming_it(
    key: str, value: object
) -> None:
    errors = _config_errors(key, value)
    for e in errors:
        assert "\n" not in e and len(e) < 400, e
        # The key itself, or (a cross-check) another key of the file.
        assert re.match(r"[a-z0-9_]+\.[a-z0-9_]+: ", e), e
    if errors:
        assert any(key in e for e in errors), errors


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("streams.roll_size", "1" + "0" * 400, "streams.roll_size: '1000000000000000000000000"),
        ("streams.roll_size", "99999999999999999999", "streams.roll_size: must be between 0 bytes"
         " and 1 PiB, got '99999999999999999999'"),
        ("streams.roll_age", "300000000000d", "streams.roll_age: must be between 0s and 3650d, "
         "got '300000000000d'"),
        ("streams.roll_age", math.nan, "streams.roll_age: expected a finite duration, got nan"),
        ("server.send_timeout", math.inf, "server.send_timeout: expected a finite duration"),
        ("fuse.owner", "²", "fuse.owner: no user named '²'"),
        ("fuse.group", "99999999999", "fuse.group: id '99999999999' is out of range"),
        ("node.data_dir", "/a\0b", "node.data_dir: must not contain a NUL character"),
        ("journal.file_size", 10**400, "journal.file_size: must be between 1 MiB and 64 GiB, got "
         "a number of about 401 digits"),
    ],
)  # fmt: skip
def test_values_out_of_range_say_the_key_and_the_range(
    key: str, value: object, expected: str
) -> None:
    errors = _config_errors(key, value)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_sizes_and_durations_are_exact_at_any_length() -> None:
    assert parse_size("1.5 KiB") == 1536
    assert parse_size("1 PiB") == 1 << 50
    assert parse_size("123456789012345678901234567890") == 123456789012345678901234567890
    assert parse_duration("1.5min") == 90.0
    assert parse_duration("300000000000d") == 300000000000 * 86400.0
    for bad in ("1" + "0" * 400, "nan", "inf", "1e3", "-1", "²"):
        with pytest.raises(ValueError):
            parse_size(bad)
        with pytest.raises(ValueError):
            parse_duration(bad)
    for bad_number in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="finite"):
            parse_duration(bad_number)


_TOML_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "+nan",
            "1e400",
            "-0.0",
            "0x7fffffffffffffff",
            "9" * 30,
            "1979-05-27T07:32:00Z",
            "[1, 2]",
            "{a = 1}",
            "'a\\u0000b'",
            '"\\u0000"',
            '"\\udcff"',
            "'''x\ny'''",
            "true",
        ]
    ),
    CONFIG_VALUES.filter(lambda v: isinstance(v, str)).map(
        lambda v: '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(all_keys()),
    literal=_TOML_SCALARS,
    junk=st.one_of(
        st.just(b""), st.binary(max_size=20), st.just(b"\xff\xfe"), st.just(b"[" * 3000)
    ),
)
@example(key="node.id", literal='"x"', junk=b"\xff")
@example(key="node.id", literal="[" * 2000 + "]" * 2000, junk=b"")
def test_check_config_of_any_file_exits_0_or_2_with_one_line_per_error(
    tmp_path_factory: pytest.TempPathFactory, key: str, literal: str, junk: bytes
) -> None:
    """``check-config`` in-process: a result or errors, never an exception."""
    section, name = key.split(".", 1)
    path = tmp_path_factory.mktemp("fuzz") / "gateway.toml"
    path.write_bytes(f"[{section}]\n{name} = {literal}\n".encode("utf-8", "surrogatepass") + junk)
    code, out, err = run_main("check-config", str(path))
    assert code in (0, 2), (code, err)
    if code == 0:
        assert out.endswith("ok (node node-1, journal /var/lib/segment-gateway/journal)\n") or (
            key.startswith(("node.", "journal."))
        ), out
    else:
        head, *lines = err.splitlines()
        assert head == f"segment-gateway: configuration {path} has {len(lines)} error(s):", err
        assert all(re.match(r"\s+([a-z0-9_]+\.[a-z0-9_]+|file): ", line) for line in lines), err


def run_main(*argv: str) -> tuple[int, str, str]:
    """``segment-gateway ARGV`` in this process: exit code, stdout, stderr."""
    import contextlib
    import io
    from unittest import mock

    from gateway import cli

    out, err = io.StringIO(), io.StringIO()
    # logs.setup would replace the test's log handlers (check_error_logs).
    with mock.patch("gateway.logs.setup"), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):  # fmt: skip
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()
