"""Printing fsck's events: one line per check, or JSON; progress on stderr."""

from __future__ import annotations

import json
import time
from typing import TextIO

from .report import CHECKS, CheckDone, Event, Finding, Progress, Tally

#: Without a terminal, a progress line at most this often (seconds): logs stay short.
PLAIN_PROGRESS_INTERVAL = 10.0


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class ProgressLine:
    """Progress of a long check on stderr: a line redrawn in place on a terminal."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.tty = err.isatty()
        self._shown = False
        self._last = -float("inf")
        self._started: dict[str, float] = {}

    def show(self, p: Progress) -> None:
        """Draw (or, without a terminal, print now and then) the progress ``p``."""
        now = time.monotonic()
        if p.check not in self._started:
            self._started[p.check] = now
            # Without a terminal, the first line comes once the check has
            # taken a while: short checks leave no trace in a log.
            self._last = now
        started = self._started[p.check]
        if not self.tty and now - self._last < PLAIN_PROGRESS_INTERVAL:
            return
        self._last = now
        pct = 100.0 * p.done_bytes / p.total_bytes if p.total_bytes else 100.0
        rate = p.done_bytes / max(now - started, 1e-3) / 2**20
        text = (
            f"{p.check}: {pct:5.1f}%  {p.done_items}/{p.total_items} chunk(s)  "
            f"{_size(p.done_bytes)} of {_size(p.total_bytes)}  {rate:.1f} MiB/s"
        )
        if self.tty:
            self.err.write(f"\r\x1b[K{text}")
            self._shown = True
        else:
            self.err.write(text + "\n")
        self.err.flush()

    def clear(self) -> None:
        """Remove the line before other output."""
        if self._shown:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._shown = False


class Printer:
    """The sink of a run in the command: prints, and counts in `tally`."""

    def __init__(self, out: TextIO, err: TextIO, as_json: bool = False) -> None:
        self.out = out
        self.as_json = as_json
        self.tally = Tally()
        self.progress = ProgressLine(err)
        self._pending: dict[str, list[Finding]] = {}

    async def __call__(self, event: Event) -> None:
        """Take one event."""
        self.tally.add(event)
        if isinstance(event, Progress):
            self.progress.show(event)
        elif isinstance(event, Finding):
            if self.as_json:
                self.progress.clear()
                self.out.write(json.dumps(event.as_dict()) + "\n")
                self.out.flush()
            else:
                self._pending.setdefault(event.check, []).append(event)
        elif isinstance(event, CheckDone) and not self.as_json:
            self.progress.clear()
            self._print_check(event.name, self._pending.pop(event.name, []))

    def _print_check(self, name: str, findings: list[Finding]) -> None:
        count = self.tally.checks[name]
        if count.skipped:
            line = f"check {name}: skipped ({count.skipped})"
        elif count.problems:
            line = f"check {name}: {count.problems} problem(s)"
            if count.repaired:
                line += f", {count.repaired} repaired"
        else:
            line = f"check {name}: ok" + (f" ({count.detail})" if count.detail else "")
        lines = [line]
        for f in findings:
            if f.problem:
                lines.append(f"  {f.message}" + (f" -- {f.action}" if f.action else ""))
            else:
                lines.append(f"  note: {f.message}")
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()

    def finish(self, mode: str) -> int:
        """Print the summary; return the exit code."""
        self.progress.clear()
        tally = self.tally
        code = tally.exit_code
        if self.as_json:
            checks = [
                {
                    "check": name,
                    "status": c.status,
                    "problems": c.problems,
                    "repaired": c.repaired,
                    "notes": c.notes,
                    "detail": c.detail,
                    "skipped": c.skipped,
                }
                for name, c in tally.checks.items()
                if c.done or name in CHECKS
            ]
            summary = {
                "mode": mode,
                "checks": checks,
                "problems": tally.problems,
                "repaired": tally.repaired,
                "exit_code": code,
            }
            self.out.write(json.dumps({"summary": summary}) + "\n")
        elif not tally.problems:
            self.out.write(f"fsck ({mode}): no problems found\n")
        else:
            left = tally.problems - tally.repaired
            self.out.write(
                f"fsck ({mode}): {tally.problems} problem(s), {tally.repaired} repaired, "
                f"{left} left\n"
            )
        self.out.flush()
        return code
