"""Progress of long commands on a terminal: done, rate and time left (where the total is known).

Drawn by tqdm on stderr, redrawn in place and erased when done (the command
then prints its own result line), and only when stderr is a terminal and
``--quiet`` was not given (`shown`): in a pipe, a log or a cron job the
commands print exactly what they did before. tqdm is imported only when a
bar is drawn, so the commands start as fast as ever.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm


def shown(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether to draw progress: not ``quiet`` and ``stream`` (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return not quiet and stream.isatty()
    except ValueError:  # closed
        return False


class Progress:
    """One bar, or nothing at all when not `shown` (every method is then a no-op).

    ``unit`` "B" counts bytes (shown as kB, MB, ... per second); any other
    unit counts items; "" counts nothing: the label and the time taken only
    (steps of one long call). ``total`` None: no percentage or time left,
    only what is done, the rate and the time taken.
    """

    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "B",
        show: bool = True,
        stream: TextIO | None = None,
    ) -> None:
        self._bar: tqdm[Any] | None = None
        if not show:
            return
        from tqdm import tqdm

        self._bar = tqdm(
            total=total,
            desc=what,
            unit=unit,
            unit_scale=unit == "B",
            file=sys.stderr if stream is None else stream,
            dynamic_ncols=True,
            mininterval=0.2,
            leave=False,
            bar_format=None if unit else "{desc} [{elapsed}]",
        )

    @property
    def drawn(self) -> bool:
        """Whether a bar is drawn at all."""
        return self._bar is not None

    def advance(self, n: int) -> None:
        """``n`` more are done."""
        if self._bar is not None and n:
            self._bar.update(n)

    def reach(self, done: int) -> None:
        """``done`` are done in all (never goes back)."""
        bar = self._bar
        if bar is not None and done > bar.n:
            bar.update(done - bar.n)

    def set_total(self, total: int | None) -> None:
        """The total became known (or changed)."""
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def describe(self, text: str) -> None:
        """What is being done now (the bar's label)."""
        if self._bar is not None:
            self._bar.set_description_str(text)

    def refresh(self) -> None:
        """Redraw (the time taken moves on while nothing is counted)."""
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        """Erase the bar (before the command prints its result)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def keep_drawing(bar: Progress, interval: float = 0.5) -> None:
    """Redraw ``bar`` every ``interval`` seconds until cancelled: a sign of life while
    the work is one long call (the daemon building an export, a rebuild)."""
    import trio

    while True:
        bar.refresh()
        await trio.sleep(interval)
