"""Tier 1: the local write-ahead journal (DESIGN.md, "Tier 1")."""

from gateway.journal.groups import JournalStatistics, Ticket
from gateway.journal.journal import Journal, open_journal
from gateway.journal.reader import ReplayResult, replay_journal

__all__ = [
    "Journal",
    "JournalStatistics",
    "ReplayResult",
    "Ticket",
    "open_journal",
    "replay_journal",
]
