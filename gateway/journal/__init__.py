"""Tier 1: the local write-ahead journal (DESIGN.md, "Tier 1")."""

from gateway.journal.journal import Journal, JournalStatistics, Ticket, open_journal
from gateway.journal.recovery import RecoveryResult, recover

__all__ = ["Journal", "JournalStatistics", "RecoveryResult", "Ticket", "open_journal", "recover"]
