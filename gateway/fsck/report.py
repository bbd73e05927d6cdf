"""What fsck reports: findings, the end of each check, progress, and the exit code.

The checks (`gateway.fsck.checks`) send *events* to a sink as they go: a
`Finding` for each thing found (a problem, or a note for the record), a
`CheckDone` when a check ends or is skipped, and `Progress` during long
checks. The same events travel over the wire protocol when a daemon runs
the checks (`to_wire` / `from_wire`), so the command prints the same lines
online and offline. `Tally` counts them and decides the exit code.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.protocol import wire_pb2 as wire

#: The checks, in the order they run (S3QL's fsck: named checks in a fixed order).
CHECKS = (
    "journal",
    "metadata",
    "chunks",
    "chunk-data",
    "attribute-index",
    "orphans",
    "cache",
    "name-claims",
)

#: Exit codes (docs/OPERATIONS.md): nothing found; everything found was
#: repaired; problems are left.
EXIT_CLEAN = 0
EXIT_REPAIRED = 1
EXIT_PROBLEMS = 2


@dataclass(frozen=True)
class Finding:
    """One thing a check found."""

    check: str
    #: True: a problem (it decides the exit code). False: a note, for the record.
    problem: bool
    #: One line for humans, naming what is affected.
    message: str
    #: What was done about it, or why nothing was ("" if nothing was attempted).
    action: str = ""
    #: The problem is fixed.
    repaired: bool = False
    segment: str = ""
    #: An object key (a chunk).
    key: str = ""
    #: A journal file.
    file: str = ""
    #: An offset in the segment, or in the journal file.
    offset: int | None = None

    def as_dict(self) -> dict[str, object]:
        """The JSON form (``--json``): every field, ``severity`` for ``problem``."""
        return {
            "check": self.check,
            "severity": "problem" if self.problem else "note",
            "repaired": self.repaired,
            "message": self.message,
            "action": self.action,
            "segment": self.segment,
            "key": self.key,
            "file": self.file,
            "offset": self.offset,
        }


@dataclass(frozen=True)
class CheckDone:
    """A check ended (its findings were sent before), or was skipped."""

    name: str
    #: Why it did not run ("" = it ran).
    skipped: str = ""
    #: What it covered, for humans.
    detail: str = ""


@dataclass(frozen=True)
class Progress:
    """How far a long check is."""

    check: str
    done_bytes: int
    total_bytes: int
    done_items: int
    total_items: int


Event = Finding | CheckDone | Progress
#: Where the checks send their events (printing, or the wire).
Sink = Callable[[Event], Awaitable[None]]


@dataclass
class CheckCount:
    """What one check found."""

    problems: int = 0
    repaired: int = 0
    notes: int = 0
    skipped: str = ""
    detail: str = ""
    done: bool = False

    @property
    def status(self) -> str:
        """``ok``, ``problems`` or ``skipped``."""
        if self.skipped:
            return "skipped"
        return "problems" if self.problems else "ok"


@dataclass
class Tally:
    """Counts the events of a run and decides the exit code."""

    checks: dict[str, CheckCount] = field(default_factory=lambda: {c: CheckCount() for c in CHECKS})

    def add(self, event: Event) -> None:
        """Count one event."""
        if isinstance(event, Finding):
            count = self.checks.setdefault(event.check, CheckCount())
            if not event.problem:
                count.notes += 1
            else:
                count.problems += 1
                count.repaired += event.repaired
        elif isinstance(event, CheckDone):
            count = self.checks.setdefault(event.name, CheckCount())
            count.skipped, count.detail, count.done = event.skipped, event.detail, True

    @property
    def problems(self) -> int:
        """Problems found, repaired or not."""
        return sum(c.problems for c in self.checks.values())

    @property
    def repaired(self) -> int:
        """Problems found and fixed."""
        return sum(c.repaired for c in self.checks.values())

    @property
    def exit_code(self) -> int:
        """0 clean, 1 everything found was repaired, 2 problems are left."""
        if not self.problems:
            return EXIT_CLEAN
        return EXIT_REPAIRED if self.repaired == self.problems else EXIT_PROBLEMS


@dataclass
class FsckRecord:
    """What the online fsck runs of this process found (the ``fsck_*`` metrics).

    Only runs that completed count; the journal check, which the command runs
    from the files itself, is not among them.
    """

    runs: int = 0
    #: When the last completed run ended (Unix time; None: none yet).
    last_run: float | None = None
    #: Problems the last completed run found and did not repair, by check.
    problems: dict[str, int] = field(default_factory=dict)

    def record(self, tally: Tally) -> None:
        """One completed run's findings."""
        self.runs += 1
        self.last_run = time.time()
        self.problems = {
            name: count.problems - count.repaired
            for name, count in tally.checks.items()
            if name != "journal"
        }


def to_wire(event: Event) -> wire.FsckResponse:
    """An event as a wire message."""
    if isinstance(event, Finding):
        f = wire.FsckFinding(
            check=event.check,
            problem=event.problem,
            repaired=event.repaired,
            message=event.message,
            action=event.action,
            segment=event.segment,
            key=event.key,
            file=event.file,
        )
        if event.offset is not None:
            f.offset = event.offset
        return wire.FsckResponse(finding=f)
    if isinstance(event, CheckDone):
        return wire.FsckResponse(
            check=wire.FsckCheck(name=event.name, skipped=event.skipped, detail=event.detail)
        )
    return wire.FsckResponse(
        progress=wire.FsckProgress(
            check=event.check,
            done_bytes=event.done_bytes,
            total_bytes=event.total_bytes,
            done_items=event.done_items,
            total_items=event.total_items,
        )
    )


def from_wire(m: wire.FsckResponse) -> Event | None:
    """The event a wire message carries (None for the closing message)."""
    kind = m.WhichOneof("kind")
    if kind == "finding":
        f = m.finding
        return Finding(
            check=f.check,
            problem=f.problem,
            message=f.message,
            action=f.action,
            repaired=f.repaired,
            segment=f.segment,
            key=f.key,
            file=f.file,
            offset=f.offset if f.HasField("offset") else None,
        )
    if kind == "check":
        return CheckDone(m.check.name, m.check.skipped, m.check.detail)
    if kind == "progress":
        p = m.progress
        return Progress(p.check, p.done_bytes, p.total_bytes, p.done_items, p.total_items)
    return None
