"""Does a model on the kernel tier slow the other models of its process?

Servers hold several models (an encoder and a decoder, a draft and a target). In one fresh process
(a fresh Inductor cache), for one model: eager and an ATen-replay copy (``static_kernel_compile=
False``) are timed alone, in interleaved rounds; then a copy on the CPU default (the kernel tier)
is called until its keys settle; then eager, the ATen copy, the tiered copy and a plain-Inductor
copy are timed again, interleaved. A tier that leaves threads, affinity or OpenMP teams behind
shows as eager and the ATen copy slower after than before; the tier's kernels against
Inductor's own show whether the graph the tier lowers is the one Inductor would.

    python benchmarks/side_by_side.py --model efficientnet --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS = ("efficientnet", "mobilenet_v2", "qwen3-token")


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The model (random weights, eval mode) and one batch of inputs."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "qwen3-token":
        from common import qwen3_token_forward

        return qwen3_token_forward()
    if name == "efficientnet":
        # B0 (the config's defaults are B7's: 600 x 600, twice as wide, three times as deep).
        config = transformers.EfficientNetConfig(
            width_coefficient=1.0,
            depth_coefficient=1.0,
            image_size=224,
            hidden_dim=1280,
            dropout_rate=0.2,
        )
        model = transformers.EfficientNetForImageClassification(config).eval()
    else:
        config = transformers.MobileNetV2Config()
        model = transformers.MobileNetV2ForImageClassification(config).eval()
    size = config.image_size
    return lambda x: model(pixel_values=x).logits, (torch.randn(1, 3, size, size),)


def per_call(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - started) / calls


def rounds(forms: dict[str, Callable[..., Any]], args: tuple[Any, ...], n: int, calls: int) -> dict:
    """Median seconds a call of each form over ``n`` interleaved rounds."""
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(n):
        for name, fn in forms.items():
            seconds[name].append(per_call(fn, args, calls))
    return {name: statistics.median(values) for name, values in seconds.items()}


def settle(fn: Callable[..., Any], args: tuple[Any, ...], limit_s: float) -> str:
    """Call ``fn`` until its keys settle; what they settled on."""
    import npugraph_ex

    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        fn(*args)
        states: dict[str, int] = {}
        for graph in npugraph_ex.stats()["graphs"]:
            for state, count in graph.get("background", {}).items():
                states[state] = states.get(state, 0) + count
        if states and not {"aten", "queued", "pending", "trial"} & set(states):
            return ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        time.sleep(0.01)
    return f"not settled after {limit_s:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="efficientnet")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=10, help="calls per form per round")
    parser.add_argument("--limit-s", type=float, default=600.0)
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="side_by_side_"))
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from common import environment, environment_line, format_table

    model, inputs = build(args.model)
    with torch.no_grad():
        aten = torch.compile(model, backend="npugraph_ex", options={"static_kernel_compile": False})
        forms = {"eager": model, "aten replay": aten}
        for fn in forms.values():
            fn(*inputs)
        before = rounds(forms, inputs, args.rounds, args.calls)
        tiered = torch.compile(model, backend="npugraph_ex")  # the CPU default
        tiered(*inputs)
        settled = settle(tiered, inputs, args.limit_s)
        inductor = torch.compile(model, backend="inductor")
        inductor(*inputs)
        after = rounds(
            {**forms, "default (tier)": tiered, "inductor": inductor},
            inputs,
            args.rounds,
            args.calls,
        )
    eager = after["eager"]
    rows = [
        [
            name,
            f"{before[name] * 1e3:.2f}" if name in before else "-",
            f"{after[name] * 1e3:.2f}",
            f"{before[name] / after[name]:.2f}x" if name in before else "-",
            f"{eager / after[name]:.2f}x",
        ]
        for name in after
    ]
    headers = ["form", "alone ms", "beside the tier ms", "alone / beside", "vs eager"]
    print(f"{args.model}: the tiered copy settled on {settled}")
    print(format_table(headers, rows))
    print(environment_line(environment()))


if __name__ == "__main__":
    main()
