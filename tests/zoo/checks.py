"""What the zoo runs on a model: forward calls and ``generate()``, compiled with npugraph_ex and
eagerly, and how long eager calls and replays take.

Each check returns a ``Check``: the outputs of both, call by call, and the capture counters of
the compiled calls, for ``tests/e2e/test_zoo.py`` to assert on and ``table`` to write down.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from helpers import counts
from npugraph_ex.bench.decode import cache_keyword
from zoo.models import VOCAB, ZooModel

BATCH, SEQ, DECODER_SEQ = 2, 8, 5
PROMPT_LEN = 5
NEW_TOKENS = 6
MAX_CACHE_LEN = 32
CALLS = 3
"""Forward calls per check, each with new inputs of one shape: one capture, then replays."""
DYNAMIC_BATCHES = (BATCH, BATCH + 1, BATCH, BATCH + 1)
"""Batch sizes of the ``dynamic=True`` forward check: one graph, a key per size, then replays
(not 1, which Dynamo specialises into a graph of its own)."""
TIMED_CALLS = 21
"""Eager calls and replays, interleaved, whose medians the table reports."""


def forward_inputs(entry: ZooModel, seed: int, batch: int = BATCH) -> dict[str, Any]:
    """One call's keyword arguments for ``entry``; ``seed`` changes values, not shapes."""
    generator = torch.Generator().manual_seed(seed)
    if entry.kind == "vision":
        size = entry.image_size
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    ids = torch.randint(3, VOCAB, (batch, SEQ), generator=generator)
    if entry.kind == "decoder":
        return {"input_ids": ids, "use_cache": False}
    # The second row is padded: the attention mask takes part in the graph.
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    mask[1, SEQ - 3 :] = 0
    if entry.kind == "encoder":
        return {"input_ids": ids, "attention_mask": mask}
    decoder_ids = torch.randint(3, VOCAB, (batch, DECODER_SEQ), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": decoder_ids,
        "use_cache": False,
    }


UNSETTLED = {"aten", "pending", "trial"}
"""Key states that may still change."""


@dataclass(frozen=True)
class Settling:
    """How the keys of a ``static_kernel_compile="background"`` model ended up."""

    states: dict[str, int]
    """Keys per state (``stats()["graphs"][i]["background"]``), summed over the graphs."""
    seconds: float
    """From the first call until the last key settled, or until the check gave up waiting."""
    calls: int

    @property
    def settled(self) -> bool:
        return not UNSETTLED & set(self.states)


@dataclass
class Check:
    """The outcome of one check: compiled and eager outputs and the counters, call by call."""

    compiled: list[torch.Tensor]
    eager: list[torch.Tensor]
    per_call: list[Counter[str]]
    seconds: tuple[float, float] | None = None
    """Median seconds of an eager call and of a replay, when the check was timed."""
    settling: Settling | None = None
    """Where the keys of ``static_kernel_compile="background"`` ended, for that check."""

    @property
    def counters(self) -> Counter[str]:
        return sum(self.per_call, Counter())

    @property
    def max_abs_diff(self) -> float:
        return max(
            float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
            for a, b in zip(self.compiled, self.eager, strict=True)
        )

    @property
    def equal(self) -> bool:
        return all(torch.equal(a, b) for a, b in zip(self.compiled, self.eager, strict=True))


@torch.no_grad()
def check_forward(
    entry: ZooModel,
    options: dict[str, Any] | None = None,
    reference: str = "eager",
    dynamic: bool = False,
    timed: int = 0,
) -> Check:
    """``CALLS`` forward calls of one shape, compiled with ``options`` against ``reference``.

    ``reference="eager"`` is the model itself; ``"dynamo"`` is ``backend="eager"``, Dynamo's
    graph without AOTAutograd or npugraph_ex, which a replay without fusion patterns must equal
    bit for bit. ``dynamic=True`` compiles both with ``dynamic=True`` and calls them with the
    batch sizes of ``DYNAMIC_BATCHES`` instead. ``timed`` > 0 then times that many eager calls
    and replays of the last inputs (``time_replays``).
    """
    model = entry.build()
    compiled_model = torch.compile(
        model,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=dynamic or None,
        options=dict(options or {}),
    )
    reference_model = (
        model
        if reference == "eager"
        else torch.compile(model, backend="eager", dynamic=dynamic or None)
    )
    batches = DYNAMIC_BATCHES if dynamic else (BATCH,) * CALLS
    inputs = [forward_inputs(entry, seed, batch) for seed, batch in enumerate(batches)]
    expected = [reference_model(**call).logits.clone() for call in inputs]
    got, per_call = [], []
    for call in inputs:
        before = counts()
        # A replay returns the graph's own memory: clone what must outlive the next call.
        got.append(compiled_model(**call).logits.clone())
        per_call.append(counts() - before)
    seconds = time_replays(model, compiled_model, inputs[-1], timed) if timed else None
    return Check(got, expected, per_call, seconds)


def time_replays(
    model: torch.nn.Module, compiled_model: Any, call: dict[str, Any], repeats: int
) -> tuple[float, float]:
    """Median wall-clock seconds of ``repeats`` eager calls and ``repeats`` replays of ``call``,
    interleaved so that both see the same load on the machine. Every compiled call must be a
    replay; a settled background key counts as one in either form it kept."""
    eager, replay = [], []
    before = counts()
    for _ in range(repeats):
        for run, times in ((model, eager), (compiled_model, replay)):
            start = time.perf_counter()
            run(**call)
            times.append(time.perf_counter() - start)
    ran = counts() - before
    if ran != Counter(replays=repeats):
        raise RuntimeError(f"expected {repeats} timed replays, the compiled calls did {dict(ran)}")
    return statistics.median(eager), statistics.median(replay)


@contextlib.contextmanager
def compiled_forward(model: torch.nn.Module, dynamic: bool | None) -> Iterator[None]:
    """``model.forward`` compiled with npugraph_ex inside the block, the way transformers documents
    ``torch.compile`` for ``generate()``; the class's own forward again after it."""
    model.forward = torch.compile(
        model.forward, backend="npugraph_ex", fullgraph=True, dynamic=dynamic
    )
    try:
        yield
    finally:
        del model.forward


def prompts(seed: int = 0) -> list[torch.Tensor]:
    """Two prompts of one length: the second generation replays what the first captured."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=generator) for _ in range(2)]


GREEDY = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
"""Greedy and always ``NEW_TOKENS`` long: an end-of-sequence token cannot end a run early."""


@torch.no_grad()
def check_generate(entry: ZooModel, cache: str) -> Check:
    """Greedy ``generate()`` of two prompts with the forward compiled, against eager.

    ``cache="dynamic"``: transformers' default cache (a ``DynamicCache``, or for encoder-decoders
    an ``EncoderDecoderCache`` of two), a new one per call, growing by a token per step; compiled
    with ``dynamic=True``, so that one graph serves every cache length (without it, Dynamo first
    traces the first step for its static shapes, and the second call's first step then goes to
    the dynamic graph, a capture more). ``cache="static"``: one ``StaticCache`` the caller keeps
    and resets between calls, passed under the keyword the installed transformers asks for, so
    its tensors keep their addresses and the second call replays the prefill and every step.
    """
    import transformers

    model = entry.build()
    if cache == "static":
        expected = [model.generate(p, **GREEDY, cache_implementation="static") for p in prompts()]
        keep = transformers.StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
        settings = {cache_keyword(model): keep}
        # Its layers allocate their tensors on first use; one eager call does that up front, so
        # that every prefill sees an initialised cache (Dynamo guards on it: a prefill over a
        # fresh cache and one over a reset cache are two graphs).
        model(input_ids=prompts()[0], **settings)
    else:
        expected = [model.generate(p, **GREEDY) for p in prompts()]
        keep, settings = None, {}
    got, per_call = [], []
    with compiled_forward(model, dynamic=True if cache == "dynamic" else None):
        for prompt in prompts():
            if keep is not None:
                keep.reset()  # zeroed in place: the KV tensors keep their addresses
            before = counts()
            got.append(model.generate(prompt, **GREEDY, **settings))
            per_call.append(counts() - before)
    return Check(got, expected, per_call)
