"""The forward check with ``static_kernel_compile="background"``, run until every key has settled.

A key starts on its ATen replay; once hot its graph is compiled with Inductor in a worker process,
the kernels are swapped in and timed against the ATen replay on real calls, and the faster form
is kept::

    ATen replays --hot--> compile in a worker --> kernels swapped in --> trial of both forms
        --> "kernels", or "aten kept: slower" / "failed"

The check calls the model with new inputs until no key is left in a state that may change, each
result compared with eager, then times eager calls against the settled key's replays. Kept
kernels fuse and reorder the arithmetic: the results are close to eager's, not equal bit for bit.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import torch

from helpers import counts, graphs_called
from npugraph_ex.kernels.processes import PROCESSES
from zoo.checks import Check, Settling, forward_inputs, time_replays
from zoo.models import ZooModel

BACKGROUND: dict[str, Any] = {"static_kernel_compile": "background", "background_compile_after": 2}
"""The options of the check: hot after two replays, so that a key gets its kernels early."""
SETTLE_SECONDS = 180.0
"""How long a model's keys may take to settle: a first compile of a small image model takes tens
of seconds on two shared cores; one that Inductor's cache on disk already holds, a few."""
BACKGROUND_ASSERTED = ("vit", "resnet")
"""Image models whose background check ``tests/e2e/test_zoo.py`` asserts on: a transformer and a
convolutional network (each waits for a compile: seconds where Inductor's cache on disk holds it,
tens of seconds where it does not)."""
PAUSE_SECONDS = 0.02
"""Between calls while a key has not settled: the compile worker needs the cores more."""


def key_states() -> dict[str, int]:
    """Keys per background state, over every graph called since the last ``reset_stats()``."""
    states: Counter[str] = Counter()
    for graph in graphs_called():
        states.update(graph.get("background", {}))
    return dict(states)


@torch.no_grad()
def check_background(entry: ZooModel, timed: int = 0) -> Check:
    """The forward check compiled with ``BACKGROUND``, called with new inputs of one shape until
    every key settled (at most ``SETTLE_SECONDS``); ``timed`` > 0 then times that many eager calls
    and replays of the settled keys (``time_replays``), not done for keys that did not settle."""
    model = entry.build()
    compiled_model = torch.compile(
        model, backend="npugraph_ex", fullgraph=True, options=dict(BACKGROUND)
    )
    got, expected, per_call = [], [], []
    started = time.monotonic()
    while True:
        call = forward_inputs(entry, seed=len(got))
        expected.append(model(**call).logits.clone())
        before = counts()
        got.append(compiled_model(**call).logits.clone())
        per_call.append(counts() - before)
        settling = Settling(key_states(), time.monotonic() - started, len(got))
        if settling.settled or settling.seconds > SETTLE_SECONDS:
            break
        time.sleep(PAUSE_SECONDS)
    if not settling.settled:
        PROCESSES.shutdown()  # a compile still running would share the next check's cores
        return Check(got, expected, per_call, settling=settling)
    seconds = time_replays(model, compiled_model, call, timed) if timed else None
    return Check(got, expected, per_call, seconds, settling)
