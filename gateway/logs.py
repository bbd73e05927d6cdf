"""Logging setup: journald-friendly under systemd, timestamps otherwise, no secrets.

Under systemd, stderr goes to the journal, which stamps every line with its
own time and reads a ``<N>`` prefix as the line's priority (sd-daemon(3)).
systemd says so by setting ``JOURNAL_STREAM`` to the device and inode of the
stream; it is only trusted if stderr still is that stream (a child started
from a service shell inherits the variable but not the stream).

Secrets -- the protocol token, S3 secret keys and session tokens -- are
replaced by ``***`` in every record, whatever logged them; botocore's own
loggers, which print signed request headers at DEBUG, are held at WARNING.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOURNAL_FORMAT = "%(name)s: %(message)s"
#: sd-daemon(3) priorities by logging level.
PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
#: Environment variables whose values are secrets wherever they appear.
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SEGMENT_GATEWAY_TOKEN")
#: Loggers that print request signatures and credentials at DEBUG.
QUIET = ("botocore", "boto3", "urllib3", "s3transfer")


def under_journald(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default stderr) is the journal stream systemd announced."""
    value = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(device) and st.st_ino == int(inode)


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message``; continuation lines get the prefix too."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in text.splitlines() or [""])


class RedactSecrets(logging.Filter):
    """Replace known secret values in a record's message and arguments."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: set[str] = {s for s in secrets if len(s) >= 4}

    def add(self, secret: str) -> None:
        """Also hide ``secret`` (values shorter than 4 characters are not worth it)."""
        if len(secret) >= 4:
            self.secrets.add(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        redacted = message
        for secret in self.secrets:
            redacted = redacted.replace(secret, "***")
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_text:
            for secret in self.secrets:
                record.exc_text = record.exc_text.replace(secret, "***")
        return True


#: The one redacting filter, on the root handler; `serve` adds config secrets.
REDACT = RedactSecrets()


def setup(level: int | str = logging.INFO, prefix: str = "") -> None:
    """Configure the root logger for the console script.

    ``prefix`` starts every message (a hosted container's process says whose
    container it is, in its host's log).
    """
    handler = logging.StreamHandler(sys.stderr)
    named = prefix + "%(name)s"
    if under_journald():
        handler.setFormatter(JournalFormatter(JOURNAL_FORMAT.replace("%(name)s", named)))
    else:
        handler.setFormatter(logging.Formatter(FORMAT.replace("%(name)s", named)))
    for name in SECRET_ENV:
        REDACT.add(os.environ.get(name, ""))
    handler.addFilter(REDACT)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
