"""Values given to `segment-gateway` and to the daemon: refused in one line, never a traceback.

Every option value is checked before the command does anything: a bad one
ends the command with one line naming the option and exit 2 (bad usage).
The in-process fuzz runs `gateway.cli.main` against an address that refuses
connections, so a value the command accepted ends in exit 24 (cannot
connect) and one it refused in exit 2, before any connection. Against a real
daemon, the largest accepted values go through, and values beyond what the
daemon takes -- from this command or any client -- get an error answer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import cli
from gateway.client.sync import SyncClient
from gateway.config import STREAM_POLICY_MAX
from gateway.errors import BadRequest
from tests.helpers.daemon import Daemon, run_cli

#: Refuses connections at once: a value the command accepted ends in exit 24.
NOWHERE = "127.0.0.1:1"


def run_main(*argv: str) -> tuple[int, str]:
    """``segment-gateway ARGV`` in this process: its exit code and stderr."""
    err = io.StringIO()
    # logs.setup would replace the test's log handlers (check_error_logs).
    with mock.patch("gateway.logs.setup"), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):  # fmt: skip
        code = cli.main(list(argv))
    return code, err.getvalue()


#: Text a user might type as a number, size or duration, and worse.
VALUE_TEXT = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.builds(
        lambda n, space, unit: f"{n}{space}{unit}",
        st.one_of(
            st.integers(min_value=0, max_value=10**25).map(str),
            st.floats(min_value=0, max_value=1e30).map(repr),
            st.sampled_from(["1" + "0" * 400, "0.5", "1.", "-3", "²", "٣"]),
        ),
        st.sampled_from(["", " "]),
        st.sampled_from(
            [
                "",
                "b",
                "KiB",
                "MiB",
                "GiB",
                "TiB",
                "PiB",
                "PB",
                "ms",
                "s",
                "min",
                "h",
                "d",
                "parsecs",
                "µs",
            ]
        ),
    ),
    st.sampled_from(
        [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "-0",
            "0",
            "",
            " ",
            "default",
            "99999999999999999999",
            "300000000000d",
            "0x10",
            "1_000",
            "\x00",
            "\uff11\uff12",  # fullwidth digits
            "9" * 5000,
        ]
    ),
)

#: (the command before the value, the option) -- the value goes in as ``--option=VALUE``.
OPTIONS = [
    (["stream", "create", "s"], "--roll-size"),
    (["stream", "set", "s"], "--roll-age"),
    (["stream", "create", "s"], "--retain-size"),
    (["stream", "set", "s"], "--retain-age"),
    (["append", "s"], "--timeout"),
    (["append", "s"], "--writer-id"),
    (["txn", "begin", "s"], "--txn-timeout"),
    (["txn", "append", ".txn/0123456789abcdef0123456789abcdef"], "--timeout"),
    (["flush", "s"], "--timeout"),
    (["cat", "s"], "--offset"),
    (["attrs", "s"], "--limit"),
    (["attrs", "s"], "--from"),
]


def check_one_line(code: int, err: str, option: str) -> None:
    """Refused (exit 2, one line naming the option) or accepted (exit 24: it tried to connect)."""
    assert code in (2, 24), (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("segment-gateway: "), err
    if code == 2:
        assert option in lines[0], err
    else:
        assert "cannot connect" in lines[0], err


@settings(max_examples=250, deadline=None)
@given(case=st.sampled_from(OPTIONS), value=VALUE_TEXT)
@example(case=(["stream", "create", "s"], "--roll-size"), value="99999999999999999999")
@example(case=(["stream", "create", "s"], "--roll-age"), value="300000000000d")
@example(case=(["stream", "create", "s"], "--roll-size"), value="²")
@example(case=(["txn", "begin", "s"], "--txn-timeout"), value="nan")
@example(case=(["txn", "begin", "s"], "--txn-timeout"), value="1e400")
@example(case=(["cat", "s"], "--offset"), value="-1")
@example(case=(["append", "s"], "--writer-id"), value="zz")
def test_every_option_value_is_refused_in_one_line_or_accepted(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[str], str], value: str
) -> None:
    command, option = case
    argv = [*command, "--connect", NOWHERE, f"{option}={value}"]
    if command[0] in ("append", "txn") and command[1:2] != ["begin"]:
        # Input from a file: stdin is not the test's to read.
        src = tmp_path_factory.mktemp("in") / "in.txt"
        src.write_bytes(b"a\nb\n")
        argv += ["--file", str(src)]
    code, err = run_main(*argv)
    check_one_line(code, err, option)


@settings(max_examples=100, deadline=None)
@given(value=VALUE_TEXT)
@example(value="99999999999999999999")
@example(value="-5")
def test_truncate_offset_is_refused_in_one_line_or_accepted(value: str) -> None:
    code, err = run_main("truncate", "s", "--connect", NOWHERE, "--", value)
    check_one_line(code, err, "OFFSET")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["stream", "create", "s", "--roll-size", "99999999999999999999"],
         "segment-gateway: stream: argument --roll-size: must be at most 1 PiB, "
         "got '99999999999999999999'"),
        (["stream", "create", "s", "--roll-age", "300000000000d"],
         "segment-gateway: stream: argument --roll-age: must be at most 3650d, "
         "got '300000000000d'"),
        (["stream", "set", "s", "--retain-age", "nan"],
         "segment-gateway: stream: argument --retain-age: cannot read 'nan' as a duration"),
        (["cat", "s", "--offset=-1"],
         "segment-gateway: cat: argument --offset: must be between 0 and 9223372036854775807"),
        (["truncate", "s", "99999999999999999999"],
         "segment-gateway: truncate: argument OFFSET: must be between 0 and"),
        (["txn", "begin", "s", "--txn-timeout", "inf"],
         "segment-gateway: txn: argument --txn-timeout: cannot read 'inf' as a duration"),
        (["append", "s", "--writer-id", "zz"],
         "segment-gateway: append: argument --writer-id: expected a UUID"),
        (["append", "s", "--timeout", "0"],
         "segment-gateway: append: argument --timeout: must be more than 0 and at most 30d"),
        (["flush", "--timeout", "-1"],
         "segment-gateway: flush: argument --timeout: cannot read '-1' as a duration"),
        (["ls", "--connect", "nowhere"],
         "segment-gateway: ls: argument --connect: expected HOST:PORT"),
        (["ls", "--connect", "127.0.0.1:99999"],
         "segment-gateway: ls: argument --connect: port 99999 is out of range"),
        (["pipeline", "run", "job", "--mount", "/m", "--out", "/o", "--cores", "0"],
         "segment-gateway: pipeline: argument --cores: must be between 1 and 4096"),
        (["create", "bad\udcffname"],
         "segment-gateway: argument SEGMENT: b'bad\\xffname' is not UTF-8"),
        (["append", "s", "--file", "/nonexistent/input"],
         "segment-gateway: cannot read /nonexistent/input: No such file or directory"),
    ],
)  # fmt: skip
def test_bad_values_say_the_option_in_one_line(argv: list[str], expected: str) -> None:
    """In a separate process, as a user runs it: no traceback, one line, exit 2 (or 1: a file)."""
    r = run_cli(*argv, "--connect", NOWHERE) if "--connect" not in argv else run_cli(*argv)
    assert r.returncode == (1 if "--file" in argv else 2), r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(expected), r.stderr


# -- against a daemon ---------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("values") / "node")
    d.start()
    yield d
    assert d.stop() == 0, d.log()


@pytest.mark.slow
def test_the_largest_accepted_values_work_and_one_more_is_refused(daemon: Daemon) -> None:
    r = run_cli("stream", "create", "big", "--connect", daemon.address, "--roll-size", "1 PiB",
                "--roll-age", "3650d", "--retain-size", "1024 PiB",
                "--retain-age", "36500d")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert '"roll_size": 1125899906842624' in r.stdout and '"roll_age_ms": 315360000000' in r.stdout
    r = run_cli(
        "stream", "set", "big", "--connect", daemon.address, "--roll-size", "1125899906842625"
    )
    assert r.returncode == 2 and "must be at most 1 PiB" in r.stderr, r.stderr
    r = run_cli("create", "plain", "--connect", daemon.address)
    assert r.returncode == 0, r.stderr
    r = run_cli("cat", "plain", "--connect", daemon.address, "--offset", str(2**63 - 1))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    r = run_cli("truncate", "plain", str(2**63 - 1), "--connect", daemon.address)
    assert r.returncode == 13 and "outside [0, 0]" in r.stderr, r.stderr
    r = run_cli("txn", "begin", "plain", "--connect", daemon.address, "--txn-timeout", "30d")
    assert r.returncode == 20 and "above streams.max_txn_timeout" in r.stderr, r.stderr
    r = run_cli("flush", "plain", "--connect", daemon.address, "--timeout", "30d")
    assert r.returncode == 0 and r.stdout == "flushed plain to Tier 2\n", r.stderr
    assert daemon.error_lines() == []


@pytest.mark.slow
@pytest.mark.parametrize("field", sorted(STREAM_POLICY_MAX))
def test_the_daemon_refuses_stream_policies_beyond_their_bounds(daemon: Daemon, field: str) -> None:
    """From any client, not only this command: the bounds of the [streams] defaults."""
    most = STREAM_POLICY_MAX[field]
    with SyncClient(daemon.address) as c:
        for value in (most + 1, 2**64 - 1):
            with pytest.raises(BadRequest, match=rf"stream policy {field} of {value} is above"):
                c.create_stream(f"wire-{field}", {field: value})
        info = c.create_stream(f"wire-{field}", {field: most})
        assert getattr(info, field) == most
        with pytest.raises(BadRequest, match=rf"stream policy {field} of {2**64 - 1} is above"):
            c.set_stream(f"wire-{field}", {field: 2**64 - 1})
        assert getattr(c.stream(f"wire-{field}"), field) == most
    assert daemon.error_lines() == []


@pytest.mark.slow
def test_a_flush_timeout_beyond_its_bound_is_refused(daemon: Daemon) -> None:
    with SyncClient(daemon.address) as c:
        c.create("flush-bound")
        with pytest.raises(BadRequest, match=r"flush timeout of \d+ ms is above"):
            c.flush("flush-bound", within=31 * 86400)
        c.flush("flush-bound", within=30 * 86400)


def test_the_fuzz_options_are_the_parsers_own() -> None:
    """Every option the fuzz names exists (a renamed one would make it pass vacuously)."""
    parser = cli.build_parser()
    text = {name: sub.format_help() for name, sub in _subparsers(parser)}
    for command, option in OPTIONS:
        assert re.search(rf"{re.escape(option)}\b", text[command[0]]), (command, option)


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()
