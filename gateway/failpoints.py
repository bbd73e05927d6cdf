"""Failpoints: named places where a test can make the daemon crash on purpose.

Crash-safety tests must kill a real daemon at an exact point (say, between
a chunk upload and its journal record), which no timing from outside can
hit reliably. ``SEGMENT_GATEWAY_FAILPOINTS="name=action,..."`` in the
daemon's environment arms them. Actions: ``kill`` (SIGKILL the process
itself, like a power cut for everything not yet fdatasync'ed), ``stall``
(block the calling thread -- the event loop -- for an hour, as a deadlocked
loop would; the test kills the daemon) and ``delay:SECONDS`` (sleep in the
calling thread each time: a slow disk when hit before an fdatasync).
Unset -- always, outside tests -- `hit` is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger(__name__)

ENV = "SEGMENT_GATEWAY_FAILPOINTS"

#: Known failpoints and where they are.
KNOWN = {
    "after_chunk_upload": "a chunk is in Tier 2, its ChunkAdded not yet journaled",
    "after_attribute_upload": "an attribute index batch is in Tier 2, not yet journaled",
    "watchdog_ping_5": "the fifth systemd watchdog ping has been sent",
    "journal_sync": "the journal writer thread is about to fdatasync a group",
    "txn_commit_sealed": "a committing transaction's seal is durable (its merge may not be)",
    "txn_commit_merged": "a transaction's merge is durable, nothing moved in Tier 2",
    "before_merge_completed": "a merge's bytes are all in Tier 2, MergeCompleted not journaled",
    "after_merge_completed": "MergeCompleted is durable (the source's chunks are the target's)",
    "after_defrag_concat": "a merged chunk is in Tier 2, its ChunksReplaced not journaled",
    "after_chunks_replaced": "ChunksReplaced is durable, the replaced objects not yet deleted",
}
ACTIONS = ("kill", "stall")


def _parse(text: str) -> dict[str, str]:
    armed = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, action = item.partition("=")
        delay = action.startswith("delay:") and action[6:].replace(".", "", 1).isdigit()
        if name not in KNOWN or (action not in ACTIONS and not delay):
            raise ValueError(f"{ENV}: unknown failpoint or action {item!r}")
        armed[name] = action
    return armed


_ARMED = _parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """Run the action armed for ``name``, if any."""
    action = _ARMED.get(name)
    if action == "kill":
        log.warning("failpoint %s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stall":
        log.warning("failpoint %s: stalling this thread", name)
        time.sleep(3600)
    elif action is not None and action.startswith("delay:"):
        time.sleep(float(action[6:]))
