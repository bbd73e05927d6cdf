"""Waiting for a condition with a deadline: the suite's one polling helper.

Tests wait on events where there are events (a trio ``Event``, a
``task_status``, ``wait_all_tasks_blocked``). State owned by another process
or thread -- a daemon's log, a file in a mount, a child's exit -- has no event
to wait on, so it is polled, always with a deadline and a message that says
what did not happen and what was seen last.

One argument order everywhere: ``wait_for(check, seconds, what)``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")

#: Exceptions of ``check`` that mean "not yet": a file not created yet, a
#: mount coming back, a daemon not listening yet. Shown as the last value when
#: the deadline passes, so a lasting error still fails the test with its text.
NOT_YET: tuple[type[BaseException], ...] = (OSError,)


def _failure(
    what: str, seconds: float, last: object, detail: Callable[[], object] | None
) -> AssertionError:
    message = f"{what}: not within {seconds} s (last: {last!r})"
    if detail is not None:
        message += f"\n{detail()}"
    return AssertionError(message)


def wait_for(
    check: Callable[[], T],
    seconds: float,
    what: str,
    *,
    interval: float = 0.05,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``check()`` until it returns something true, and return that.

    Raises ``AssertionError`` naming ``what`` and the last value (or error)
    after ``seconds`` seconds, followed by ``detail()`` if given (a log, the
    counters so far). An assertion inside ``check`` fails at once. For state
    of other threads and processes.
    """
    deadline = time.monotonic() + seconds
    last: object = None
    while True:
        try:
            value = check()
        except not_yet as e:
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise _failure(what, seconds, last, detail)
        time.sleep(interval)


async def async_wait_for(
    check: Callable[[], T | Awaitable[T]],
    seconds: float,
    what: str,
    *,
    interval: float = 0.01,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
    detail: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_for` in trio: sleeps on trio's clock between checks.

    For state that has no event to wait on (a counter a background task
    bumps, a child process's state); under ``autojump_clock`` the deadline is
    in virtual time. ``check`` may be async: each call gets the time left (at
    least a second), and running out is a ``trio.TooSlowError`` -- "not yet"
    if ``not_yet`` says so.
    """
    deadline = trio.current_time() + seconds
    last: object = None
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                with trio.fail_after(max(1.0, deadline - trio.current_time())):
                    value: T = await result
            else:
                value = result
        except not_yet as e:
            last = e
        else:
            if value:
                return value
            last = value
        if trio.current_time() > deadline:
            raise _failure(what, seconds, last, detail)
        await trio.sleep(interval)
