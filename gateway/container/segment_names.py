"""Segment names (DESIGN.md, "Segments").

A name is its path under the mount: ``/``-separated components, each
``[A-Za-z0-9._-]{1,255}`` and not ``.`` or ``..``, at most 16 components and
1024 bytes in all.
"""

from __future__ import annotations

import re

from gateway.errors import InvalidName

MAX_NAME_BYTES = 1024
MAX_DEPTH = 16
_COMPONENT = re.compile(r"[A-Za-z0-9._-]{1,255}")
#: The mount's trimmed view (fs/vfs.py) lives at this top-level name.
TRIMMED_DIR = ".trimmed"


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid segment name; raise InvalidName saying why."""
    if not isinstance(name, str) or not name:
        raise InvalidName(name, "empty")
    if len(name) > MAX_NAME_BYTES:
        raise InvalidName(name[:40] + "...", f"longer than {MAX_NAME_BYTES} bytes")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH:
        raise InvalidName(name, f"more than {MAX_DEPTH} components")
    for part in parts:
        if not part:
            raise InvalidName(name, "empty component (leading, trailing or double '/')")
        if part in (".", ".."):
            raise InvalidName(name, f"component {part!r} is not allowed")
        if not _COMPONENT.fullmatch(part):
            raise InvalidName(name, f"component {part!r} has characters outside A-Z a-z 0-9 . _ -")
    return name


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a name or name start (may end with ``/``)."""
    if prefix:
        validate_name(prefix.rstrip("/") or "x")
    return prefix


def check_creatable(name: str) -> None:
    """Raise InvalidName if ``name`` is where the mount shows something else."""
    if name.split("/", 1)[0] == TRIMMED_DIR:
        raise InvalidName(name, f"{TRIMMED_DIR}/ is the mount's trimmed view of every segment")
