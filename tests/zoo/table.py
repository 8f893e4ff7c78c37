"""The table of ``docs/zoo.md``: every check of every zoo model, one row each.

A row says what the check captured, replayed and fell back on, how close it came to eager, what
its background keys settled on, and eager calls against replays, timed::

    PYTHONPATH=src:tests python -m zoo.table --out docs/zoo.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import npugraph_ex
from npugraph_ex.bench.environment import environment, environment_line
from npugraph_ex.bench.tables import format_table
from npugraph_ex.capture.tiers import TRIAL_CALLS
from zoo.background import BACKGROUND, BACKGROUND_ASSERTED, SETTLE_SECONDS, check_background
from zoo.checks import (
    BATCH,
    CALLS,
    DECODER_SEQ,
    DYNAMIC_BATCHES,
    MAX_CACHE_LEN,
    NEW_TOKENS,
    PROMPT_LEN,
    SEQ,
    TIMED_CALLS,
    Check,
    check_forward,
    check_generate,
)
from zoo.models import CALIBRATION_BATCH, VOCAB, ZOO, ZooModel

CHECKS: dict[str, Callable[[ZooModel], Check]] = {
    "forward": lambda entry: check_forward(entry, timed=TIMED_CALLS),
    "forward, dynamic=True": lambda entry: check_forward(entry, dynamic=True, timed=TIMED_CALLS),
    "generate, default cache": lambda entry: check_generate(entry, "dynamic"),
    "generate, StaticCache": lambda entry: check_generate(entry, "static"),
    "forward, static kernels": lambda entry: check_forward(entry, entry.options, timed=TIMED_CALLS),
    "forward, background": lambda entry: check_background(entry, timed=TIMED_CALLS),
}


def checks_of(entry: ZooModel) -> list[str]:
    """The checks that apply to ``entry``, in table order."""
    names = ["forward"]
    if entry.dynamic:
        names.append("forward, dynamic=True")
    if entry.kind in ("decoder", "seq2seq"):
        names.append("generate, default cache")
    if entry.kind == "decoder":
        names.append("generate, StaticCache")
    if entry.options:
        names.append("forward, static kernels")
    if entry.kind == "vision":
        names.append("forward, background")
    return names


def verdict(name: str, check: Check) -> str:
    """Equal to eager: tokens for generation; for logits, bit for bit, or within float32's
    tolerance, or (Inductor's kernels on a deep network) only within ``LOOSE``."""
    if check.equal:
        return "yes (bit for bit)" if name.startswith("forward") else "yes (tokens)"
    if not name.startswith("forward"):
        return "NO"
    pairs = list(zip(check.compiled, check.eager, strict=True))
    if all(torch.allclose(a, b, **FLOAT32) for a, b in pairs):
        return "yes (within 1e-5)"
    if all(torch.allclose(a, b, **LOOSE) for a, b in pairs):
        return "within 1e-4 only"
    return "NO"


FLOAT32 = dict(rtol=1.3e-6, atol=1e-5)
"""``torch.testing.assert_close``'s tolerance for float32."""
LOOSE = dict(rtol=1e-4, atol=1e-4)
"""For Inductor's kernels: they reorder float32 sums, and through a deep network with random
weights that reaches the logits; plain ``torch.compile`` misses ``FLOAT32`` on LeViT and
MobileNetV2 too."""


def why(counters: Counter[str], prefix: str) -> str:
    reasons = [
        f"{key[len(prefix) :]} x{n}" for key, n in counters.items() if key.startswith(prefix)
    ]
    return ", ".join(reasons) or "none"


def table_rows(names: list[str]) -> list[list[Any]]:
    """One row per model and check; a check that raises keeps its row, with its error."""
    rows = []
    for name in names:
        entry = ZOO[name]
        for check_name in checks_of(entry):
            torch._dynamo.reset()
            npugraph_ex.reset_stats()
            print(f"{name}: {check_name} ...", file=sys.stderr, flush=True)
            head = [name, entry.model_class, check_name]
            try:
                check = CHECKS[check_name](entry)
            except Exception as error:  # any failure: the table reports it
                message = f"error: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
                rows.append(head + ["-", "-", "-", message, "-", "NO", "-", "-"])
                continue
            counters = check.counters
            rows.append(
                head
                + [
                    counters["captures"],
                    counters["replays"],
                    why(counters, "recapture:"),
                    why(counters, "eager:"),
                    f"{check.max_abs_diff:.3g}",
                    verdict(check_name, check),
                    settled_on(check),
                    timing(check),
                ]
            )
    return rows


def settled_on(check: Check) -> str:
    """The background states of the check's keys and the seconds they took to get there
    (``kernels (12 s)``), or what was still unsettled when the check stopped waiting."""
    if check.settling is None:
        return "-"
    states = ", ".join(
        state if n == 1 else f"{state} x{n}" for state, n in sorted(check.settling.states.items())
    )
    if not check.settling.settled:
        return f"not settled after {check.settling.seconds:.0f} s: {states}"
    return f"{states} ({check.settling.seconds:.0f} s)"


def timing(check: Check) -> str:
    """``eager / replay`` medians in milliseconds and how many times faster the replay is."""
    if check.seconds is None:
        return "-"
    eager, replay = check.seconds
    return f"{eager * 1e3:.2f} / {replay * 1e3:.2f} (x{eager / replay:.2f})"


HEADERS = (
    "model",
    "class",
    "check",
    "keys captured",
    "replays",
    "recaptures (why)",
    "eager fallbacks (why)",
    "max abs diff",
    "equal to eager",
    "background keys",
    "eager / replay, ms",
)

PREAMBLE = """# Model zoo

Hugging Face transformers architectures built from tiny configs (text: hidden size 32, two
layers, a vocabulary of {vocab}; images: two or three narrow stages, MobileNetV2's 17 blocks at a
quarter of their width, or two transformer layers of width 32, and 10 labels) with random weights,
compiled with `backend="npugraph_ex"` and default options, and compared with eager. The image
models' BatchNorm layers get what training would give them: scale 1, shift 0 and the statistics
of a batch of {calibration} random images (a fresh layer does not normalise, and with random
weights the logits of MobileNetV2 and MobileViT would shrink to 1e-26 and 0). Checks:

- **forward**: {calls} calls of one shape with new inputs each (batch {batch}, {seq} tokens; the
  encoders' second row padded; {decoder_seq} decoder tokens for the encoder-decoders; for the
  image models, images of {images}): one key captured, then replays.
- **forward, dynamic=True**: the forward check compiled with `dynamic=True` (and compared with
  eager) over batches of {dynamic_batches}: one graph, a key per batch size, then replays.
- **generate, default cache**: greedy `generate()` ({new} new tokens) of two prompts of {prompt}
  tokens, with `model.forward` compiled (`fullgraph=True, dynamic=True`) and transformers' default
  cache, new per call. Each step is a new cache length and so a key; the second prompt replays them.
- **generate, StaticCache**: the same with one `StaticCache({cache_len})` that the caller keeps
  and resets between the prompts, passed as `cache=` (the name transformers 5.24 asks for); the
  eager reference uses `cache_implementation="static"`.
- **forward, static kernels**: the forward check with `static_kernel_compile=True`.
- **forward, background** (image models): the forward check with
  `{background}`,
  called with new inputs until every key has settled (at most {settle:.0f} s): the key replays its
  ATen kernels, once hot its graph is compiled with Inductor in a worker process, and the kernels,
  swapped in, are timed against the ATen replay on {trial} real calls each; the faster is kept.
  "Background keys" says what each key settled on, `kernels` or `aten kept: slower` (or
  `failed`), and how long after the first call; the counters count the calls until then. Those
  seconds are with Inductor's cache on disk already holding the kernels; a first compile takes
  tens of seconds. A trial of {trial} calls on shared cores can go either way, from one run to the
  next, for a key whose two forms are close. A key that keeps its ATen replay runs the same
  replay as the plain forward check (docs/guide.md, "Tiered kernels").

Counters come from `npugraph_ex.stats()` over all of a check's calls. "Equal to eager" is
`torch.equal` of the logits (bit for bit) or of the generated tokens, or for logits that differ,
`torch.allclose` within the float32 tolerance of `torch.testing.assert_close` (rtol 1.3e-6, atol
1e-5): Inductor's kernels (static kernels, background keys during their trial or once they keep
them) fuse and reorder the arithmetic and are not expected to match eager bit for bit. Through
a deep network that can exceed float32's tolerance, as plain `torch.compile` does on LeViT and
MobileNetV2: "within 1e-4 only" is within rtol and atol 1e-4. `max abs diff` is over the logits
of every call, or the token ids. The same checks are assertions in `tests/e2e/test_zoo.py` (the
background check for {background_asserted} only).

"Eager / replay" is measured, not asserted: after a forward check (for the background check, once
its keys have settled), {timed} eager calls of the model and {timed} replays of its key on the
check's last inputs, interleaved, and the median wall-clock time of each, on the machine named
below (its cores possibly shared with other work: a ratio is a rough guide); "x1.20" means the
replay took 1/1.2 of the eager time.

{fallbacks}Written by `PYTHONPATH=src:tests python -m zoo.table --out docs/zoo.md`
({seconds:.0f} s).

{environment}; npugraph_ex commit {commit}.

"""


def fallback_notes(names: list[str]) -> str:
    """The expected eager fallbacks of ``names``, one paragraph each."""
    notes = [
        f"Fallback, {name} ({check}): {reason}.\n\n"
        for name in names
        for check, reason in ZOO[name].fallbacks.items()
    ]
    return "".join(notes)


def image_sizes(names: list[str]) -> str:
    """``16x16 for vit, deit; 32x32 for resnet``: the image models of ``names`` by size."""
    by_size: dict[int, list[str]] = {}
    for name in names:
        if ZOO[name].kind == "vision":
            by_size.setdefault(ZOO[name].image_size, []).append(name)
    parts = [f"{size}x{size} for {', '.join(group)}" for size, group in sorted(by_size.items())]
    return "; ".join(parts) or "none"


def write_table(out: Path, names: list[str]) -> str:
    env = environment()
    start = time.perf_counter()
    rows = table_rows(names)
    preamble = PREAMBLE.format(
        vocab=VOCAB,
        calls=CALLS,
        batch=BATCH,
        seq=SEQ,
        decoder_seq=DECODER_SEQ,
        calibration=CALIBRATION_BATCH,
        images=image_sizes(names),
        dynamic_batches=", ".join(map(str, DYNAMIC_BATCHES)),
        timed=TIMED_CALLS,
        new=NEW_TOKENS,
        prompt=PROMPT_LEN,
        cache_len=MAX_CACHE_LEN,
        background=", ".join(f"{k}={json.dumps(v)}" for k, v in BACKGROUND.items()),
        settle=SETTLE_SECONDS,
        trial=TRIAL_CALLS,
        background_asserted=", ".join(BACKGROUND_ASSERTED),
        seconds=time.perf_counter() - start,
        environment=environment_line(env),
        fallbacks=fallback_notes(names),
        commit=(env["npugraph_ex_commit"] or "unknown")[:12],
    )
    text = preamble + format_table(HEADERS, rows) + "\n"
    out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/zoo.md"), help="Markdown to write")
    parser.add_argument("--models", help=f"comma-separated subset of: {', '.join(ZOO)}")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(ZOO)
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo holds {', '.join(ZOO)}")
    print(write_table(args.out, names))


if __name__ == "__main__":
    main()
