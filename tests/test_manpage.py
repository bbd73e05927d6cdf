"""segment-gateway(1), generated from the argparse definitions (scripts/gen_manpage.sh),
as man renders it; and the help every command shows."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess

import pytest

from gateway.cli.program import build_parser

from .conftest import ROOT


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.timeout(60)
def test_the_man_page_renders_cleanly_with_every_command(tmp_path: pathlib.Path) -> None:
    if shutil.which("man") is None:
        pytest.skip("no man (Debian's man-db)")
    page = tmp_path / "segment-gateway.1"
    r = subprocess.run([ROOT / "scripts" / "gen_manpage.sh", page], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "MANWIDTH": "100", "MANPAGER": "cat"}
    r = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                       timeout=30, env=env)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no roff warning
    text = r.stdout
    assert text.startswith("SEGMENT-GATEWAY(1)")
    for name in _commands():
        assert f"COMMAND 'segment-gateway {name}'" in text, name
    for section in ("SYNOPSIS", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"):
        assert f"\n{section}\n" in text, section
    assert "--quiet" in text and "SEGMENT_GATEWAY_TOKEN" in text
    # The same tree gives the same page (dated by its last commit).
    again = tmp_path / "again.1"
    subprocess.run([ROOT / "scripts" / "gen_manpage.sh", again], check=True, timeout=60)
    assert again.read_bytes() == page.read_bytes()


def test_every_command_and_argument_says_what_it_is() -> None:
    """`--help` reads well: each command has a description, each argument a help line
    (none starting with "." or "'", which roff takes for a request in the man page)."""
    bare = []
    for name, parser in _commands().items():
        assert parser.description, name
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            what = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                bare.append(what)
            elif action.help.startswith((".", "'")):
                bare.append(f"{what}: starts with {action.help[0]!r}")
            if not action.option_strings and action.metavar is None and not action.choices:
                bare.append(f"{what}: no metavar (shown in lower case)")
    assert bare == []
