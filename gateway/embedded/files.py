"""The embedded server's local files: written atomically, its log read back."""

from __future__ import annotations

import os
import pathlib
import re

__all__ = ["explain", "write_atomically"]

#: Log lines that say why weed stopped: glog's fatal level, a bad flag, a Go panic.
_FATAL = re.compile(r"^F\d{4} |flag provided but not defined|^panic: ")


def explain(path: pathlib.Path, lines: int = 20) -> str:
    """What the log says went wrong: its fatal lines, then its last ``lines`` lines.

    Fatal messages are not always last: after a bad flag, weed prints its
    whole usage text.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    all_lines = text.splitlines()
    fatal = [line for line in all_lines if _FATAL.search(line)][:5]
    tail = "\n".join(all_lines[-lines:])
    return "\n".join(fatal) + f"\n--- end of {path} ---\n{tail}"


def write_atomically(path: pathlib.Path, text: str, mode: int = 0o644) -> None:
    """Temp file, fsync, rename, fsync the directory (the convention for local state).

    The file has ``mode`` (less the umask) from its creation on: a secret is
    never readable by others, not even for a moment.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w") as f:
        granted = os.fstat(fd).st_mode & 0o777
        if granted & ~mode:  # a leftover tmp file keeps its old mode
            os.fchmod(fd, granted & mode)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
