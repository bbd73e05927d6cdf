"""The directory tree the mount shows, implied by segment names (a model; no FUSE here).

Borg's shape: the FUSE `Operations` (to come) are a thin translation over
this model, which is tested without mounting. A segment ``a/b/c`` is the file
``c`` in the directory ``a/b``; directories exist while a segment lies below
them and are never created or removed by hand.

Inode numbers:

- the root is 1 (``pyfuse3.ROOT_INODE``);
- a segment's inode is ``SEGMENT_INODE_BASE + segment id``: segment ids are
  never reused, so a file keeps its inode for its whole life, across daemon
  restarts, and a deleted segment's inode never names another;
- directories get numbers from 2 up, in order of first appearance. They are
  stable while the daemon runs; after a restart a directory may get another
  number (NFS-style exports would need more; the kernel only needs inodes
  not to be reused while it may still hold them, which the ever-growing
  counter guarantees).

A name that is both a segment and a directory (segments ``a`` and ``a/b``)
cannot be shown as both: the directory wins and the segment ``a`` is hidden
(`Tree.hidden` counts such segments).

A stream is a directory from its creation to its deletion, whether or not a
segment lies below it (readers that start before its first append, a glob
or Spark's ``readStream``, must find it): `Tree.keep_directory` keeps a
directory while empty, `Tree.release_directory` lets it go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROOT_INODE = 1
SEGMENT_INODE_BASE = 1 << 40


@dataclass
class _Dir:
    path: str
    parent: int
    #: name -> inode of every entry (directory or segment) directly inside.
    entries: dict[str, int] = field(default_factory=dict)


class Tree:
    """Directories and segment files by inode and by name."""

    def __init__(self) -> None:
        self._dirs: dict[int, _Dir] = {ROOT_INODE: _Dir("", ROOT_INODE)}
        self._dir_by_path: dict[str, int] = {"": ROOT_INODE}
        self._next_dir = ROOT_INODE + 1
        #: segment inode -> its name, shown or hidden (the parent directory is
        #: found by the name's path: no tuple per segment, 56 bytes of 10^6).
        self._segments: dict[int, str] = {}
        #: segment inodes hidden by a directory of the same path.
        self._hidden: set[int] = set()
        #: directory inodes kept while empty (streams).
        self._kept: set[int] = set()

    # -- changes -----------------------------------------------------------------

    @staticmethod
    def segment_inode(segment_id: int) -> int:
        """The inode of the segment with this id."""
        return SEGMENT_INODE_BASE + segment_id

    def add_segment(self, segment_id: int, name: str) -> int:
        """Show a segment (idempotent); returns its inode."""
        inode = self.segment_inode(segment_id)
        if inode in self._segments:
            return inode
        dirname, _, base = name.rpartition("/")
        parent = self._make_dirs(dirname)
        self._segments[inode] = name
        if base in self._dirs[parent].entries:
            self._hidden.add(inode)  # a directory has that path
        else:
            self._dirs[parent].entries[base] = inode
        return inode

    def remove_segment(self, segment_id: int) -> list[tuple[int, str, int]]:
        """The segment is gone: remove its file and the directories it leaves empty.

        Returns the entries that went, as (directory inode, name, inode): the
        kernel's cached names for them must be invalidated.
        """
        inode = self.segment_inode(segment_id)
        name = self._segments.pop(inode, None)
        if name is None:
            return []
        if inode in self._hidden:
            self._hidden.discard(inode)
            return []
        dirname, _, base = name.rpartition("/")
        parent = self._dir_by_path[dirname]
        del self._dirs[parent].entries[base]
        return [(parent, base, inode), *self._prune(parent)]

    def keep_directory(self, path: str) -> int:
        """Show the directory ``path`` (and its parents) even while empty; its inode."""
        inode = self._make_dirs(path)
        self._kept.add(inode)
        return inode

    def release_directory(self, path: str) -> list[tuple[int, str, int]]:
        """Stop keeping ``path``: it goes now if empty (with the parents it leaves empty).

        Returns the entries that went, as `remove_segment` does.
        """
        inode = self._dir_by_path.get(path)
        if inode is None or inode not in self._kept:
            return []
        self._kept.discard(inode)
        return self._prune(inode)

    def _make_dirs(self, path: str) -> int:
        inode = self._dir_by_path.get(path)
        if inode is not None:
            return inode
        parent_path, _, base = path.rpartition("/")
        parent = self._make_dirs(parent_path)
        inode = self._next_dir
        self._next_dir += 1
        self._dirs[inode] = _Dir(path, parent)
        self._dir_by_path[path] = inode
        entries = self._dirs[parent].entries
        shadowed = entries.get(base)
        if shadowed is not None:  # a segment had this path: the directory wins
            self._hidden.add(shadowed)
        entries[base] = inode
        return inode

    def _prune(self, inode: int) -> list[tuple[int, str, int]]:
        gone = []
        while inode != ROOT_INODE and not self._dirs[inode].entries and inode not in self._kept:
            d = self._dirs.pop(inode)
            del self._dir_by_path[d.path]
            base = d.path.rpartition("/")[2]
            del self._dirs[d.parent].entries[base]
            gone.append((d.parent, base, inode))
            self._unhide(d.path, d.parent, base)
            inode = d.parent
        return gone

    def _unhide(self, path: str, parent: int, base: str) -> None:
        """A directory went away: a segment hidden by it shows again."""
        for inode in list(self._hidden):
            if self._segments[inode] == path:
                self._hidden.discard(inode)
                self._dirs[parent].entries[base] = inode
                return

    # -- queries -------------------------------------------------------------------

    def lookup(self, parent: int, name: str) -> int | None:
        """The inode of ``name`` in directory ``parent``, or None."""
        d = self._dirs.get(parent)
        return None if d is None else d.entries.get(name)

    def path_of(self, inode: int) -> str | None:
        """The path of a live directory ("" for the root), or None."""
        d = self._dirs.get(inode)
        return None if d is None else d.path

    def is_dir(self, inode: int) -> bool:
        """Whether ``inode`` is a live directory."""
        return inode in self._dirs

    def segment_name(self, inode: int) -> str | None:
        """The segment a file inode shows, or None."""
        found = self._segments.get(inode)
        return None if found is None or inode in self._hidden else found

    def parent(self, inode: int) -> int | None:
        """The directory holding ``inode`` (the root's parent is the root)."""
        if inode in self._dirs:
            return self._dirs[inode].parent
        found = self._segments.get(inode)
        return None if found is None else self._dir_by_path.get(found.rpartition("/")[0])

    def entries(self, inode: int) -> list[tuple[str, int]]:
        """(name, inode) of a directory's entries, sorted by name (readdir order)."""
        d = self._dirs.get(inode)
        return [] if d is None else sorted(d.entries.items())

    @property
    def hidden(self) -> int:
        """Segments not shown because a directory has their path."""
        return len(self._hidden)

    @property
    def directories(self) -> int:
        """Live directories, the root included."""
        return len(self._dirs)
