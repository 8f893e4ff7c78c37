"""The progress printer: in-place bar on a terminal, plain start and end lines elsewhere."""

from __future__ import annotations

import io

import pytest

from npugraph_ex.bench.progress import Progress, bar


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bar_fills_in_proportion() -> None:
    assert bar(0, 4, width=8) == "[--------]"
    assert bar(1, 4, width=8) == "[##------]"
    assert bar(4, 4, width=8) == "[########]"
    assert bar(9, 4, width=8) == "[########]"


def test_off_a_terminal_each_phase_writes_a_start_and_an_end_line() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, tty=False, clock=clock)
    with progress.phase("growing: npugraph_ex, first run", total=3) as advance:
        for _ in range(3):
            clock.now += 0.5
            advance()
    with progress.phase("building Qwen3 tiny"):
        clock.now += 2.0
    assert stream.getvalue().splitlines() == [
        "growing: npugraph_ex, first run ...",
        "growing: npugraph_ex, first run: done in 1.5 s (3/3)",
        "building Qwen3 tiny ...",
        "building Qwen3 tiny: done in 2.0 s",
    ]
    assert "\r" not in stream.getvalue()


def test_on_a_terminal_one_line_is_redrawn_at_most_every_interval() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, tty=True, clock=clock, interval=0.1)
    with progress.phase("timing", total=4) as advance:
        advance()  # same instant as the first draw: skipped
        clock.now += 0.2
        advance()
        advance()  # same instant again: skipped
        clock.now += 0.2
        advance()
    text = stream.getvalue()
    draws = text.split("\r\x1b[K")[1:]
    assert draws == [
        "timing [------------------------] 0/4 0.0 s",
        "timing [############------------] 2/4 0.2 s",
        "timing [########################] 4/4 0.4 s",
        "timing [########################] 4/4 0.4 s\n",
    ]
    assert text.count("\n") == 1


def test_a_failing_phase_says_so_and_raises() -> None:
    stream = io.StringIO()
    progress = Progress(stream, tty=False, clock=Clock())
    with pytest.raises(RuntimeError, match="boom"), progress.phase("decode: inductor"):
        raise RuntimeError("boom")
    assert stream.getvalue().splitlines()[-1] == "decode: inductor: failed"


def test_the_stream_decides_whether_it_is_a_terminal() -> None:
    assert Progress(io.StringIO()).tty is False
