"""User-facing errors.

Every error an operator or client may see is a subclass of `GatewayError`.
Following borg, each class's docstring is its message template (formatted with
the constructor's arguments) and each class carries the process exit code the
CLI uses for it. The codes are listed in docs/OPERATIONS.md.
"""

from __future__ import annotations

from typing import ClassVar


class GatewayError(Exception):
    """Error: {}"""

    #: Exit code of the CLI when this error ends it.
    exit_code: ClassVar[int] = 1

    def message(self) -> str:
        """The formatted, one-line message for humans."""
        template = type(self).__doc__ or "{}"
        try:
            return template.format(*self.args)
        except (IndexError, KeyError):
            return f"{type(self).__name__}: {self.args!r}"

    def __str__(self) -> str:
        return self.message()


class ConfigError(GatewayError):
    """configuration {} has {} error(s):
    {}"""

    exit_code = 2

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(source, len(errors), "\n".join(f"  {e}" for e in errors))
        #: One line per problem, each naming the key: "section.key: reason".
        self.errors = list(errors)


class JournalError(GatewayError):
    """journal error: {}"""


class JournalCorrupt(JournalError):
    """journal is corrupt: {} at offset {}: {}. The journal was not changed; \
run `segment-gateway fsck` (or `segment-gateway journal-dump` to inspect)"""

    exit_code = 3

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(path, offset, reason)
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalLocked(JournalError):
    """journal directory {} is in use by another process ({}); \
only one daemon may open a journal"""

    exit_code = 4


class JournalFailed(JournalError):
    """journal failed and accepts no more appends: {}. Acknowledged operations are safe; \
restart the daemon to recover"""

    exit_code = 5


class JournalFull(JournalError):
    """journal disk is full: cannot allocate {} bytes in {} ({}). Nothing was written; \
free space and retry"""

    exit_code = 6


class JournalClosed(JournalError):
    """journal is closed"""


class OperationTooLarge(GatewayError):
    """operation of {} bytes exceeds the limit of {} bytes"""

    exit_code = 2
