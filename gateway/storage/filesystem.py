"""The filesystem binding: Tier-2 objects as files under a root directory.

For ``[tier2] url = "file:///path"`` (a local disk, or a shared filesystem
such as NFS). It supports `append` (data written in place at an offset) and
`concat` (``copy_file_range``, a reflink on filesystems that have them).

On-disk layout under the root::

    <root>/<key>                     the object's bytes, nothing else
    <root>/.meta/<key>               its user metadata, JSON (the "sidecar")
    <dir>/.tmp-<32 hex digits>       a file being written; renamed onto its
                                     final name when complete (in both trees)

A key ``a/b/c`` is the file ``<root>/a/b/c``: the key's ``/`` separators are
directories, created on demand and removed again when a delete leaves them
empty (the root and ``.meta`` themselves are never removed).

The sidecar holds one JSON object:

``version``
    format of the sidecar, 1.
``metadata``
    the object's user metadata, an object of string to string.

A missing sidecar means "no metadata" (``{}``); a sidecar without its object
(only left by hand, see `FileStorage.delete`) is never read.

Reserved names, so that neither tree can be mistaken for objects: a key may
not be ``.meta`` or start with ``.meta/``, and no key component may start with
``.tmp-``. Keys are also rejected (`ValueError`) when absolute or when they
have empty, ``.`` or ``..`` components. Unlike S3, a filesystem cannot hold
both ``a`` and ``a/b``: writing one while the other exists raises `Tier2Error`.

Crash safety (S3QL's ``write_params``): `write` and `concat` fill a temporary
file in the target directory, fsync it, rename it onto the final name and
fsync the directory, so after a crash the key holds either the old object or
the complete new one. The data is renamed before the sidecar, so a crash in
between leaves the new bytes with the previous (or no) metadata. A temporary
file left by a crash is invisible to `FileStorage.list` and never read;
`FileStorage.remove_temp_files` deletes old ones. `append` writes in place
(that is its point): a crash may leave part of the appended bytes, which the
caller's retry of the same append (same offset) replaces.

Errors: a missing object raises `ChunkNotFound`; other failures are the
`OSError` the system call raised, classified by `FileStorage.is_temp_failure`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from stat import S_ISDIR, S_ISREG
from typing import TYPE_CHECKING

from gateway.buffers import Buffer
from gateway.errors import ChunkCorrupt, ChunkNotFound, Tier2Error
from gateway.journal.files import fsync_directory
from gateway.storage.interface import ObjectInfo

if TYPE_CHECKING:
    from gateway.storage.interface import ChunkStorage

__all__ = ["META_DIR", "SIDECAR_VERSION", "TEMP_PREFIX", "FileStorage", "validate_key"]

#: Top-level directory holding the metadata sidecars (a tree parallel to the objects).
META_DIR = ".meta"
#: Name prefix of files being written; never an object.
TEMP_PREFIX = ".tmp-"
#: Value of the sidecar's ``version`` field.
SIDECAR_VERSION = 1

# errno values after which the same call may succeed if repeated. EINTR is
# mostly retried by Python itself (PEP 475), but not on every path. ESTALE is
# an NFS file handle invalidated by the server: a retry opens the path afresh.
# EIO is deliberately absent by default: on a local disk it reports a media or
# controller failure that retrying does not cure, and retrying would only hide
# a dying disk behind the retry policy's deadline. On a soft-mounted network
# filesystem it is what a server timeout looks like, hence the opt-in.
# ENOSPC/EDQUOT are final too: space is freed by an operator, not by waiting;
# the storage writer tries again at its next flush anyway.
_TEMP_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE})

# How often a write re-creates its directory when a concurrent delete removed
# it between mkdir and creating the temporary file (see `_create_temp`).
_DIRECTORY_RACE_ATTEMPTS = 16

# Block size of the copy loop used when copy_file_range is not available.
_COPY_BLOCK = 8 * 1024 * 1024

# copy_file_range errors meaning "not here" rather than "failed": crossing
# filesystems (kernels before 5.3), no syscall, or a filesystem without support.
_NO_COPY_FILE_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})


# The class's `list` method hides the builtin inside the class body.
_Listing = list[ObjectInfo]


def validate_key(key: str) -> list[str]:
    """The components of ``key``; `ValueError` if the filesystem binding cannot use it."""
    if not key:
        raise ValueError("empty object key")
    if key.startswith("/"):
        raise ValueError(f"object key {key!r} is absolute")
    if "\0" in key:
        raise ValueError(f"object key {key!r} contains a NUL character")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' component")
        if part.startswith(TEMP_PREFIX):
            raise ValueError(
                f"object key {key!r}: components starting {TEMP_PREFIX!r} are reserved"
            )
    if parts[0] == META_DIR:
        raise ValueError(f"object key {key!r}: {META_DIR!r} is reserved for metadata")
    return parts


def _byte_view(data: Buffer) -> memoryview:
    """``data`` as a flat view of bytes, so lengths and slices count bytes."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    """pwrite all of ``view`` at ``offset`` (a single pwrite may write less)."""
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _copy_range(src: int, dst: int, count: int, dst_offset: int) -> None:
    """Copy ``count`` bytes from the start of ``src`` to ``dst_offset`` of ``dst``."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < count:
                n = os.copy_file_range(src, dst, count - done, done, dst_offset + done)
                if n == 0:
                    break
                done += n
        except OSError as e:
            # Nothing was copied by the failing call, so the plain loop below
            # can continue from `done` when the kernel only lacks support.
            if e.errno not in _NO_COPY_FILE_RANGE:
                raise
    while done < count:
        block = os.pread(src, min(_COPY_BLOCK, count - done), done)
        if not block:
            break
        _write_all(dst, memoryview(block), dst_offset + done)
        done += len(block)
    if done != count:
        # Sources are immutable chunks; one that shrank under us is not one.
        raise Tier2Error(f"concat source changed while being copied ({done} of {count} bytes)")


class FileStorage:
    """`ChunkStorage` on a directory tree (see the module docstring for the layout).

    Thread-safe without locks: every call works on its own file descriptors
    and temporary names, and races between writes and the removal of empty
    directories are retried. Appends to one key must be serialized by the
    caller (the storage writer does).
    """

    kind = "file"
    supports_append = True
    supports_concat = True

    def __init__(self, root: pathlib.Path, *, eio_is_temporary: bool = False) -> None:
        """Store objects under ``root`` (created if missing).

        ``eio_is_temporary``: treat EIO as a temporary failure; only for a
        soft-mounted network filesystem, where it signals a server timeout.
        """
        self.root = pathlib.Path(root).absolute()
        self.eio_is_temporary = eio_is_temporary
        self._meta_root = self.root / META_DIR
        self._make_dirs(self._meta_root)

    @classmethod
    def from_url(cls, url: str) -> FileStorage:
        """The storage for a ``file:///absolute/path`` URL (percent-escapes allowed)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise ValueError(f"not a local file URL (file:///PATH): {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"file URL must not have a query or fragment: {url!r}")
        path = urllib.parse.unquote(parts.path)
        if not path.startswith("/") or path.rstrip("/") == "":
            raise ValueError(f"file URL needs an absolute path other than '/': {url!r}")
        return cls(pathlib.Path(path))

    def __repr__(self) -> str:
        return f"FileStorage({str(self.root)!r})"

    # -- paths --------------------------------------------------------------

    def _path(self, key: str) -> pathlib.Path:
        return self.root.joinpath(*validate_key(key))

    def _meta_path(self, key: str) -> pathlib.Path:
        return self._meta_root.joinpath(*validate_key(key))

    def _make_dirs(self, directory: pathlib.Path) -> None:
        """Create ``directory`` and missing parents, each made durable in its parent."""
        missing = []
        d = directory
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                # Made by a concurrent write (and perhaps removed again by a
                # delete, which the next step notices); only a file is a conflict.
                try:
                    if S_ISDIR(os.lstat(d).st_mode):
                        continue
                except FileNotFoundError:
                    continue
                raise
            fsync_directory(d.parent)

    def _fsync_nearest(self, directory: pathlib.Path) -> None:
        """fsync ``directory`` or, if it was removed, its nearest existing ancestor.

        A removed directory (by us or a concurrent delete) takes its entries
        with it, so making the removal durable makes theirs durable too.
        """
        while True:
            try:
                fsync_directory(directory)
                return
            except FileNotFoundError:
                if directory == self.root:
                    raise
                directory = directory.parent

    def _remove_empty_dirs(self, directory: pathlib.Path, top: pathlib.Path) -> None:
        """Remove ``directory`` and its parents below ``top`` while they are empty."""
        while directory != top and top in directory.parents:
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass  # removed by a concurrent delete; its parent may be empty now
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return
                raise
            directory = directory.parent

    # -- atomic replacement ---------------------------------------------------

    def _create_temp(self, directory: pathlib.Path) -> tuple[int, pathlib.Path]:
        """Open a new temporary file in ``directory`` (made if missing)."""
        for attempt in range(_DIRECTORY_RACE_ATTEMPTS):
            temp = directory / f"{TEMP_PREFIX}{secrets.token_hex(16)}"
            try:
                self._make_dirs(directory)
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                # A delete of the last object in a directory on our path
                # removed it between its mkdir and the next step; once our
                # file is in it, it cannot be removed, so go again.
                if attempt == _DIRECTORY_RACE_ATTEMPTS - 1:
                    raise
                continue
            return fd, temp
        raise AssertionError("unreachable")

    def _replace(self, path: pathlib.Path, fill: Callable[[int], None]) -> None:
        """Make ``path`` hold what ``fill(fd)`` writes, atomically and durably."""
        fd, temp = self._create_temp(path.parent)
        try:
            try:
                fill(fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        fsync_directory(path.parent)

    def _write_meta(self, key: str, metadata: Mapping[str, str]) -> None:
        doc = {"version": SIDECAR_VERSION, "metadata": dict(metadata)}
        blob = json.dumps(doc, ensure_ascii=False, sort_keys=True).encode()
        try:
            self._replace(self._meta_path(key), lambda fd: _write_all(fd, memoryview(blob), 0))
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as e:
            raise self._conflict(key, e) from e

    def _read_meta(self, key: str) -> dict[str, str]:
        try:
            with open(self._meta_path(key), "rb") as f:
                blob = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        try:
            doc = json.loads(blob)
            metadata = doc["metadata"]
            if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
            ):
                raise TypeError("metadata is not an object of strings")
        except (ValueError, KeyError, TypeError) as e:
            raise ChunkCorrupt(key, f"metadata sidecar {self._meta_path(key)}: {e}") from e
        return metadata

    def _conflict(self, key: str, e: OSError) -> Tier2Error:
        return Tier2Error(
            f"cannot store {key!r}: a filesystem cannot hold both an object and objects "
            f"below it ({e.strerror}: {e.filename})"
        )

    # -- ChunkStorage -----------------------------------------------------------

    def write(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Create or replace ``key`` atomically (temp file, fsync, rename, fsync dir)."""
        view = _byte_view(data)
        path = self._path(key)
        try:
            self._replace(path, lambda fd: _write_all(fd, view, 0))
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as e:
            raise self._conflict(key, e) from e
        self._write_meta(key, metadata)

    def write_if_absent(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> bool:
        """Create ``key`` only if it does not exist (a hard link: atomic, also on NFS)."""
        view = _byte_view(data)
        path = self._path(key)
        try:
            fd, temp = self._create_temp(path.parent)
            try:
                try:
                    _write_all(fd, view, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(temp, path)
                except FileExistsError:
                    return False
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
        except (NotADirectoryError, IsADirectoryError) as e:
            raise self._conflict(key, e) from e
        fsync_directory(path.parent)
        self._write_meta(key, metadata)
        return True

    def read(self, key: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key``; shorter only at its end."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range: offset {offset}, length {length}")
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ChunkNotFound(key) from None
        try:
            st = os.fstat(fd)
            if not S_ISREG(st.st_mode):
                raise ChunkNotFound(key)  # a directory: only keys below it exist
            # Clamping to the size first lets os.pread allocate the result at
            # its final size and read straight into it: one allocation, no
            # copy (a bytearray filled by preadv would need one to become bytes).
            n = min(length, st.st_size - offset)
            if n <= 0:
                return b""
            data = os.pread(fd, n, offset)
            if len(data) == n or not data:
                return data
            # Short read: more than the kernel's 2 GiB per call, or a network
            # filesystem. Rare, so joining the pieces is fine.
            parts = [data]
            got = len(data)
            while got < n:
                more = os.pread(fd, n - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            return b"".join(parts)
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        """Delete ``key`` and its sidecar, then directories left empty; missing is fine."""
        path = self._path(key)
        meta = self._meta_path(key)
        # The sidecar goes first: a crash in between leaves a visible object
        # without metadata, which a repeated delete removes, rather than an
        # orphan sidecar that could later block a key below its name.
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
            os.unlink(meta)
        try:
            os.unlink(path)
            unlinked = True
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            unlinked = False
        self._remove_empty_dirs(path.parent, self.root)
        self._remove_empty_dirs(meta.parent, self._meta_root)
        if unlinked:
            # A delete that returned must stay done: a resurrected chunk
            # would confuse fsck and GC even though nothing names it.
            self._fsync_nearest(path.parent)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix`` (any string), in key order.

        The listing is collected before returning, so the caller's worker
        thread does all the blocking. Metadata is left empty.
        """
        directory_part, _, name_prefix = prefix.rpartition("/")
        out: _Listing = []
        if directory_part:
            try:
                validate_key(directory_part)
            except ValueError:
                return iter(out)  # no valid key starts with it
            self._walk(self.root / directory_part, directory_part + "/", name_prefix, out)
        else:
            self._walk(self.root, "", name_prefix, out)
        return iter(out)

    def _walk(
        self, directory: pathlib.Path, key_prefix: str, name_prefix: str, out: _Listing
    ) -> None:
        try:
            with os.scandir(directory) as it:
                entries = [e for e in it if e.name.startswith(name_prefix)]
        except (FileNotFoundError, NotADirectoryError):
            return
        # Sorting a directory as "name/" gives key order: all its keys start so.
        # E.g. "x-1" < "x/1" < "x0", while by bare names "x" sorts before "x-1".
        ordered: list[tuple[str, os.DirEntry[str], bool]] = []
        for e in entries:
            if e.name.startswith(TEMP_PREFIX) or (not key_prefix and e.name == META_DIR):
                continue
            if e.is_dir(follow_symlinks=False):
                ordered.append((e.name + "/", e, True))
            elif e.is_file(follow_symlinks=False):
                ordered.append((e.name, e, False))
        ordered.sort(key=lambda t: t[0])
        for name, e, is_dir in ordered:
            if is_dir:
                self._walk(pathlib.Path(e.path), key_prefix + name, "", out)
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we listed
            out.append(ObjectInfo(key_prefix + name, st.st_size, st.st_mtime))

    def stat(self, key: str) -> ObjectInfo:
        """Size, mtime and user metadata of ``key``; `ChunkNotFound` if missing."""
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise ChunkNotFound(key) from None
        if not S_ISREG(st.st_mode):
            raise ChunkNotFound(key)
        return ObjectInfo(key, st.st_size, st.st_mtime, self._read_meta(key))

    def append(self, key: str, offset: int, data: Buffer, metadata: Mapping[str, str]) -> None:
        """Write ``data`` at ``offset`` of ``key`` and end the object there.

        The object must exist and hold at least ``offset`` bytes; bytes past
        ``offset`` (from an earlier, partly done attempt) are replaced, so a
        retry is idempotent. ``metadata`` replaces the sidecar afterwards.
        """
        if offset < 0:
            raise ValueError(f"bad append offset {offset}")
        view = _byte_view(data)
        try:
            fd = os.open(self._path(key), os.O_WRONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ChunkNotFound(key) from None
        try:
            size = os.fstat(fd).st_size
            if size < offset:
                raise Tier2Error(
                    f"append to {key!r} at offset {offset}, but the object has only {size} bytes"
                )
            _write_all(fd, view, offset)
            # Cut what an earlier, longer attempt left past the new end.
            os.ftruncate(fd, offset + len(view))
            # fdatasync also persists the size change: the data needs it.
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._write_meta(key, metadata)

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Create ``key`` atomically as the concatenation of ``sources`` (which stay).

        ``sizes``: the bytes taken of each source (None: each whole).
        """
        if sizes is not None and len(sizes) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(sizes)} sizes")
        path = self._path(key)
        fds: list[int] = []
        try:
            for source in sources:
                try:
                    fds.append(os.open(self._path(source), os.O_RDONLY | os.O_CLOEXEC))
                except (FileNotFoundError, NotADirectoryError):
                    raise ChunkNotFound(source) from None
                if not S_ISREG(os.fstat(fds[-1]).st_mode):
                    raise ChunkNotFound(source)

            lengths = [os.fstat(fd).st_size for fd in fds]
            if sizes is not None:
                for source, have, want in zip(sources, lengths, sizes, strict=True):
                    if have < want:
                        raise Tier2Error(
                            f"concat into {key!r}: {source!r} holds {have} bytes, not {want}"
                        )
                lengths = list(sizes)

            def fill(dst: int) -> None:
                position = 0
                for src, size in zip(fds, lengths, strict=True):
                    _copy_range(src, dst, size, position)
                    position += size

            try:
                self._replace(path, fill)
            except (NotADirectoryError, IsADirectoryError, FileExistsError) as e:
                raise self._conflict(key, e) from e
        finally:
            for fd in fds:
                os.close(fd)
        self._write_meta(key, metadata)

    def is_temp_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` may go away on retry: busy, timed out, stale NFS handle, ..."""
        if not isinstance(exc, OSError) or isinstance(exc, Tier2Error):
            return False
        if exc.errno == errno.EIO:
            return self.eio_is_temporary
        return exc.errno in _TEMP_ERRNOS

    def remove_temp_files(self, min_age: float = 3600.0) -> int:
        """Delete temporary files older than ``min_age`` seconds (left by crashes).

        Younger ones may belong to writes in progress. Returns how many went.
        """
        cutoff = time.time() - min_age
        removed = 0
        for directory, _dirs, files in os.walk(self.root):
            for name in files:
                if not name.startswith(TEMP_PREFIX):
                    continue
                path = os.path.join(directory, name)
                try:
                    if os.lstat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def close(self) -> None:
        """Nothing to release: no descriptor outlives a call."""


if TYPE_CHECKING:
    # mypy proves here that the binding satisfies the protocol.
    _protocol_check: type[ChunkStorage] = FileStorage
