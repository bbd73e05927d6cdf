"""The mount's directory tree model (fs/tree.py), without mounting."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from fs.tree import ROOT_INODE, Tree


def walk(tree: Tree) -> tuple[set[str], dict[str, int]]:
    """(directory paths, file path -> inode) reachable from the root."""
    dirs: set[str] = set()
    files: dict[str, int] = {}
    stack = [("", ROOT_INODE)]
    while stack:
        path, inode = stack.pop()
        dirs.add(path)
        for name, child in tree.entries(inode):
            child_path = f"{path}/{name}" if path else name
            assert tree.lookup(inode, name) == child
            assert tree.parent(child) == inode
            if tree.is_dir(child):
                stack.append((child_path, child))
            else:
                assert tree.segment_name(child) == child_path
                files[child_path] = child
    return dirs, files


def expected(names: dict[int, str]) -> tuple[set[str], set[str]]:
    dirs = {""}
    for n in names.values():
        parts = n.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return dirs, {n for n in names.values() if n not in dirs}


def test_directories_are_implied_and_pruned() -> None:
    t = Tree()
    a = t.add_segment(1, "logs/app/0")
    t.add_segment(2, "logs/app/1")
    t.add_segment(3, "top")
    assert [n for n, _ in t.entries(ROOT_INODE)] == ["logs", "top"]
    logs = t.lookup(ROOT_INODE, "logs")
    assert logs is not None and t.is_dir(logs)
    app = t.lookup(logs, "app")
    assert app is not None and [n for n, _ in t.entries(app)] == ["0", "1"]
    assert t.segment_name(a) == "logs/app/0" and a == Tree.segment_inode(1)
    t.remove_segment(1)
    t.remove_segment(2)
    assert t.lookup(ROOT_INODE, "logs") is None and not t.is_dir(app)
    assert t.directories == 1
    # Inodes of directories are not reused.
    t.add_segment(4, "logs/x")
    assert t.lookup(ROOT_INODE, "logs") not in (logs, app)


def test_a_directory_hides_a_segment_of_the_same_path_until_it_goes() -> None:
    t = Tree()
    t.add_segment(1, "a")
    t.add_segment(2, "a/b")
    a = t.lookup(ROOT_INODE, "a")
    assert a is not None and t.is_dir(a) and t.hidden == 1
    t.remove_segment(2)
    assert t.lookup(ROOT_INODE, "a") == Tree.segment_inode(1) and t.hidden == 0


def test_a_kept_directory_shows_while_empty_and_goes_when_let_go() -> None:
    """A stream's directory: there from its creation, whatever its segments do."""
    t = Tree()
    d = t.keep_directory("a/stream")
    a = t.lookup(ROOT_INODE, "a")
    assert a is not None and t.lookup(a, "stream") == d and t.is_dir(d)
    assert t.entries(d) == []
    t.add_segment(1, "a/stream/000000000001")
    t.remove_segment(1)  # its last segment goes: the directory stays
    assert t.lookup(a, "stream") == d and t.entries(d) == []
    assert t.keep_directory("a/stream") == d
    gone = t.release_directory("a/stream")
    assert gone == [(a, "stream", d), (ROOT_INODE, "a", a)]
    assert t.lookup(ROOT_INODE, "a") is None and t.directories == 1
    assert t.release_directory("a/stream") == []
    # Released while segments are below: it goes with the last of them.
    d = t.keep_directory("s")
    t.add_segment(2, "s/000000000001")
    assert t.release_directory("s") == []
    assert t.lookup(ROOT_INODE, "s") == d
    assert t.remove_segment(2)[-1] == (ROOT_INODE, "s", d)
    assert t.directories == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(1, 12),
            st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map("/".join),
        ),
        max_size=40,
    )
)
def test_tree_matches_the_live_names(ops: list[tuple[bool, int, str]]) -> None:
    t = Tree()
    live: dict[int, str] = {}
    for add, segment_id, name in ops:
        if add and segment_id not in live and name not in live.values():  # names are unique
            live[segment_id] = name
            t.add_segment(segment_id, name)
        elif not add and segment_id in live:
            del live[segment_id]
            t.remove_segment(segment_id)
    dirs, files = walk(t)
    want_dirs, want_files = expected(live)
    assert dirs == want_dirs
    assert set(files) == want_files
    # A segment whose path is a directory is hidden.
    assert t.hidden == len(live) - len(files)


def test_ten_thousand_segments_list_quickly() -> None:
    t = Tree()
    started = time.monotonic()
    for i in range(10_000):
        t.add_segment(i + 1, f"d{i % 100}/s{i}")
    d0 = t.lookup(ROOT_INODE, "d0")
    assert d0 is not None
    assert len(t.entries(ROOT_INODE)) == 100 and len(t.entries(d0)) == 100
    assert time.monotonic() - started < 2.0
