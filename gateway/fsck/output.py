"""Printing fsck's events: one line per check, or JSON; progress on a terminal."""

from __future__ import annotations

import json
from typing import TextIO

from gateway.progress import Progress as ProgressBar
from gateway.progress import shown

from .report import CHECKS, CheckDone, Event, Finding, Progress, Tally


class ProgressLine:
    """Progress of a long check: a bar on a terminal (`gateway.progress`), else nothing."""

    def __init__(self, err: TextIO, quiet: bool = False) -> None:
        self.err = err
        self.drawn = shown(quiet, err)
        self._bar: ProgressBar | None = None
        self._check = ""

    def show(self, p: Progress) -> None:
        """Draw the progress ``p`` (a new bar for each check)."""
        if not self.drawn:
            return
        if self._bar is None or p.check != self._check:
            self.clear()
            self._check = p.check
            self._bar = ProgressBar(p.check, p.total_bytes or None, stream=self.err)
        self._bar.reach(p.done_bytes)
        self._bar.describe(f"{p.check}: {p.done_items}/{p.total_items} chunk(s)")  # redraws

    def clear(self) -> None:
        """Remove the bar before other output."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Printer:
    """The sink of a run in the command: prints, and counts in `tally`."""

    def __init__(
        self, out: TextIO, err: TextIO, as_json: bool = False, quiet: bool = False
    ) -> None:
        self.out = out
        self.as_json = as_json
        self.tally = Tally()
        self.progress = ProgressLine(err, quiet)
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
