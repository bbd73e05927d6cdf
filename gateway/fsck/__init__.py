"""fsck: named checks of a node's journal, metadata, Tier-2 chunks and cache.

The layers, after S3QL's ``fsck.py``:

- `gateway.fsck.checks`: one function per check, run in a fixed order
  (`report.CHECKS`), each reporting what it found and, with ``--repair``,
  what it fixed -- the checks in modules by what they check (`target`,
  `journal_check`, `metadata_check`, `chunk_checks`, `orphan_check`,
  `cache_check`);
- `gateway.fsck.run`: the command -- offline on a stopped node's
  directories, or online through a running daemon;
- `gateway.fsck.online`: the daemon's side of an ``FsckRequest``;
- `gateway.fsck.report` and `gateway.fsck.output`: findings, exit codes,
  printing.

Exit codes: 0 nothing found, 1 everything found was repaired, 2 problems
are left (docs/OPERATIONS.md, "fsck").
"""

from gateway.fsck.checks import Options
from gateway.fsck.report import CHECKS, EXIT_CLEAN, EXIT_PROBLEMS, EXIT_REPAIRED
from gateway.fsck.run import FsckUsageError, fsck

__all__ = [
    "CHECKS",
    "EXIT_CLEAN",
    "EXIT_PROBLEMS",
    "EXIT_REPAIRED",
    "FsckUsageError",
    "Options",
    "fsck",
]
