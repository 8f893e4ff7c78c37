"""Progress of long phases on stderr: a bar redrawn in place on a terminal, plain lines elsewhere.

Compiling and capturing a model takes seconds to minutes with nothing else to show, so each long
phase reports itself. On a terminal one line is redrawn in place (``\\r``), at most every
``interval`` seconds; piped into a file or a CI log, where carriage returns turn into clutter,
each phase writes one line when it starts and one when it ends. Nothing here touches stdout,
which carries the results.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

BAR_WIDTH = 24
CLEAR_LINE = "\r\x1b[K"


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####-----]``: ``done`` of ``total`` as a bar of ``width`` cells."""
    filled = width * min(done, total) // total if total > 0 else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class Progress:
    """Reports phases on ``stream`` (stderr unless given)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else self.stream.isatty()
        self.clock = clock
        self.interval = interval

    @contextmanager
    def phase(self, label: str, total: int | None = None) -> Iterator[Callable[[], None]]:
        """Report ``label`` while the body runs; the body calls what it is given once per unit.

        ``total`` units make a bar (terminal) and a count (both); without it only the elapsed
        time shows.
        """
        start = self.clock()
        done = 0
        drawn = -self.interval

        def draw(final: bool) -> None:
            nonlocal drawn
            now = self.clock()
            if not final and now - drawn < self.interval:
                return
            drawn = now
            count = f" {bar(done, total)} {done}/{total}" if total else ""
            end = "\n" if final else ""
            self.write(f"{CLEAR_LINE}{label}{count} {now - start:.1f} s{end}")

        def advance() -> None:
            nonlocal done
            done += 1
            if self.tty:
                draw(final=False)

        if self.tty:
            draw(final=False)
        else:
            self.write(f"{label} ...\n")
        try:
            yield advance
        except BaseException:
            self.write(f"{CLEAR_LINE if self.tty else ''}{label}: failed\n")
            raise
        if self.tty:
            draw(final=True)
        else:
            count = f" ({done}/{total})" if total else ""
            self.write(f"{label}: done in {self.clock() - start:.1f} s{count}\n")

    def note(self, text: str) -> None:
        """One line that stays (a warning or a finding worth reading while the run goes on)."""
        self.write(f"{CLEAR_LINE if self.tty else ''}{text}\n")

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
