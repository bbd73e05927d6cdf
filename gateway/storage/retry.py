"""The one retry policy for every Tier-2 call.

Modelled on S3QL's ``retry`` decorator (``backends/common.py``): the binding
says which failures are temporary (``is_temp_failure``), and this module
decides how long to wait and when to give up. Waits grow exponentially from
``first_delay`` up to ``max_delay`` with full jitter (a uniformly random wait
between zero and the current bound, so that many callers hit by the same
outage do not come back in lockstep); a server's ``Retry-After`` is honoured.
An overall deadline, measured on the trio clock, ends the retrying: the
failure then becomes a `Tier2Error` that says what was being done.

The deadline bounds the retrying, not one attempt: an attempt in flight is
bounded by the binding's own request timeout, and is never abandoned half-way
(an abandoned upload would keep its worker thread and connection busy).

Log lines get louder the longer a call fails: debug for the first retries
(a single 503 is routine on S3), then info, then warning.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from gateway.errors import Tier2Error

__all__ = ["RetryEvent", "retrying"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Retries logged at debug level; up to `_INFO_UNTIL`, info; after it, warning.
_DEBUG_UNTIL = 2
_INFO_UNTIL = 5


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen, as reported to ``on_retry`` (for statistics)."""

    #: What the call was doing (the ``what`` argument of `retrying`).
    what: str
    #: The temporary failure that caused the retry.
    error: BaseException
    #: The attempt that failed (1 for the first).
    attempt: int
    #: Seconds waited before the next attempt.
    delay: float


def _describe(exc: BaseException) -> str:
    """The failure in a few words, for messages (some exceptions have an empty str)."""
    # A plain Tier2Error by its argument: no second "Tier 2 failed:" in front.
    text = str(exc.args[0]) if type(exc) is Tier2Error and exc.args else str(exc)
    return text or type(exc).__name__


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    is_temp_failure: Callable[[BaseException], bool],
    what: str,
    deadline: float,
    retry_after: Callable[[BaseException], float | None] | None = None,
    first_delay: float = 0.05,
    max_delay: float = 5.0,
    on_retry: Callable[[RetryEvent], None] | None = None,
) -> T:
    """Await ``call()`` until it succeeds, retrying temporary failures for ``deadline`` seconds.

    ``is_temp_failure`` classifies an exception raised by ``call``;
    ``retry_after`` may extract a wait the server asked for, which is
    honoured even above ``max_delay`` (but never past the deadline).
    ``on_retry`` is told about every retry before its wait.

    Raises `Tier2Error` ``"{what}: {error}"`` (chained from the error) when a
    failure is not temporary or the deadline has passed. `Tier2Error` and
    its subclasses (`ChunkNotFound`, `ChunkCorrupt`, `BindingUnsupported`)
    pass through unchanged unless temporary: they already say what failed.
    Cancellation is never caught.
    """
    start = trio.current_time()
    give_up_at = start + deadline
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Exception as exc:
            temporary = is_temp_failure(exc)
            if not temporary:
                if isinstance(exc, Tier2Error):
                    raise
                raise Tier2Error(f"{what}: {_describe(exc)}") from exc
            now = trio.current_time()
            remaining = give_up_at - now
            if remaining <= 0:
                raise Tier2Error(
                    f"{what}: {_describe(exc)} (gave up after {attempt} attempts "
                    f"in {now - start:.1f} s)"
                ) from exc
            # Full jitter over a bound that doubles per attempt, capped.
            bound = min(max_delay, first_delay * 2 ** (attempt - 1))
            delay = random.uniform(0, bound)
            asked = retry_after(exc) if retry_after is not None else None
            if asked is not None:
                delay = max(delay, asked)
            delay = min(delay, remaining)
            if attempt <= _DEBUG_UNTIL:
                level = logging.DEBUG
            elif attempt <= _INFO_UNTIL:
                level = logging.INFO
            else:
                level = logging.WARNING
            log.log(
                level,
                "%s: temporary failure (attempt %d): %s; retrying in %.2f s",
                what,
                attempt,
                _describe(exc),
                delay,
            )
            if on_retry is not None:
                on_retry(RetryEvent(what=what, error=exc, attempt=attempt, delay=delay))
            await trio.sleep(delay)
