"""fsck check 1, ``journal``: every frame and its CRC32C, sequence numbers and epochs,
as recovery reads them; a torn tail, files without frames, and corruption (a bad
frame with valid frames after it)."""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass, field

import trio

from gateway.errors import JournalCorrupt
from gateway.journal.files import list_files
from gateway.journal.reader import FileEnd, mapped, read_frames, replay_journal, valid_frames_after

from .report import Finding
from .target import CheckRun

#: Running daemon: a journal read that races with its writer is read again.
ONLINE_JOURNAL_ATTEMPTS = 3


@dataclass
class JournalScan:
    """What the journal check found (computed in a worker thread, reported after)."""

    findings: list[Finding] = field(default_factory=list)
    detail: str = ""
    #: Acknowledged operations are unreadable: the metadata cannot be rebuilt.
    corrupt: bool = False


def _first_bad_frames(directory: pathlib.Path) -> list[tuple[FileEnd, int]]:
    """Per file, the first bad frame (if any) and how many valid frames follow it there."""
    bad = []
    for jf in list_files(directory):
        with mapped(jf.path) as data:
            for item in read_frames(data, jf.path):
                if isinstance(item, FileEnd) and not item.is_clean:
                    later = sum(1 for _ in valid_frames_after(data, item.offset + 1, jf.path))
                    bad.append((item, later))
    return bad


def _scan_journal(directory: pathlib.Path, online: bool, repair: bool) -> JournalScan:
    """Read the journal as recovery does, without changing it unless repairing."""
    scan = JournalScan()
    name = "journal"
    bad = _first_bad_frames(directory)
    corrupt: JournalCorrupt | None = None
    try:
        result = replay_journal(directory, repair=False)
    except JournalCorrupt as e:
        corrupt = e
    if corrupt is not None:
        scan.corrupt = True
        # Removing an unreadable frame would lose acknowledged operations,
        # and every later operation's sequence number depends on it.
        action = "not repaired: no safe repair exists (docs/OPERATIONS.md, fsck)" if repair else ""
        where = (corrupt.path, corrupt.offset)
        scan.findings.append(
            Finding(
                name,
                True,
                f"{pathlib.Path(corrupt.path).name} offset {corrupt.offset}: {corrupt.reason}; "
                "acknowledged operations there cannot be read, so the daemon refuses to start",
                action,
                file=corrupt.path,
                offset=corrupt.offset,
            )
        )
        for end, later in bad:
            if (str(end.path), end.offset) != where:
                scan.findings.append(
                    Finding(
                        name,
                        True,
                        f"{end.path.name} offset {end.offset}: bad frame ({end.reason}), "
                        f"{later} valid frame(s) after it in the file",
                        action,
                        file=str(end.path),
                        offset=end.offset,
                    )
                )
        return scan
    scan.detail = (
        f"{len(result.files)} file(s), {result.frames} frame(s), "
        f"{result.operations} operation(s), {len(result.checkpoints)} checkpoint(s), "
        f"last epoch {result.max_epoch}"
    )
    torn = result.torn
    fixable = not online and (torn is not None or result.empty_files)
    if repair and fixable:
        # What the daemon's next start would do, under the lock fsck holds.
        replay_journal(directory, repair=True)
    if torn is not None:
        if online:
            scan.findings.append(
                Finding(
                    name,
                    False,
                    f"{torn.path.name} offset {torn.offset}: the tail is being written "
                    f"({torn.reason})",
                    file=str(torn.path),
                    offset=torn.offset,
                )
            )
        else:
            scan.findings.append(
                Finding(
                    name,
                    True,
                    f"{torn.path.name} offset {torn.offset}: torn write at the tail "
                    f"({torn.reason}); it was never acknowledged and the next start cuts it off",
                    "cut off" if repair else "",
                    repaired=repair,
                    file=str(torn.path),
                    offset=torn.offset,
                )
            )
    for path in result.empty_files:
        if online:
            scan.findings.append(
                Finding(name, False, f"{path.name}: no frames yet (being created)", file=str(path))
            )
        else:
            scan.findings.append(
                Finding(
                    name,
                    True,
                    f"{path.name}: holds no frames (a crash right after creating it)",
                    "deleted" if repair else "",
                    repaired=repair,
                    file=str(path),
                )
            )
    return scan


def scan_journal(directory: pathlib.Path, online: bool, repair: bool) -> JournalScan:
    """The journal check's findings (blocking; see `check_journal`)."""
    attempts = ONLINE_JOURNAL_ATTEMPTS if online else 1
    for attempt in range(1, attempts + 1):
        try:
            scan = _scan_journal(directory, online, repair and not online)
        except FileNotFoundError:
            # The daemon deleted a file it no longer needs while we read.
            if attempt == attempts:
                raise
            continue
        # A group being written may look like corruption to a reader that
        # saw its frames half written and the next group complete: a real
        # corruption is still there when read again.
        if scan.corrupt and attempt < attempts:
            time.sleep(0.2)
            continue
        return scan
    raise AssertionError("unreachable")


async def check_journal(directory: pathlib.Path, run: CheckRun, online: bool = False) -> bool:
    """Check 1: the journal's frames. Returns False if it is corrupt or unreadable.

    Read-only and lock-free like ``journal-dump``; ``online`` (a daemon
    writes it) means a torn tail is the group being written: a note. With
    ``--repair`` offline, a torn tail is cut off and files without frames
    are deleted, as the next start would; corruption is never touched.
    """
    try:
        scan = await trio.to_thread.run_sync(scan_journal, directory, online, run.options.repair)
    except OSError as e:
        await run.problem(f"cannot read the journal in {directory}: {e}", file=str(directory))
        await run.done()
        return False
    for f in scan.findings:
        if f.problem:
            await run.problem(
                f.message, action=f.action, repaired=f.repaired, file=f.file, offset=f.offset
            )
        else:
            await run.note(f.message, file=f.file)
    run.detail = scan.detail
    await run.done()
    return not scan.corrupt
