"""Is the CPU default at least as fast as the faster of eager and plain Inductor on every image
model of the zoo, alone and with two other compiled models in its process?

Each model of ``tests/zoo/models.py``'s ``vision`` kind runs in a fresh process of its own (a fresh
Inductor cache), on one batch of its images: a copy on the default (the kernel tier) is called
until its keys settle, a plain-Inductor copy is compiled, and eager, the default and Inductor are
timed in interleaved rounds ("alone"). Then two other compiled models join the process, the tiny
Qwen3's one-token forward on the default (settled on its kernels) and ResNet (MobileNetV2 for
ResNet itself) under plain Inductor, each called once before every timed call, and the three
forms are timed again ("beside two others"), once the default has settled again: building the
neighbours changes transformers' registries, which Dynamo guards, so every form compiles again
(the default's new graph goes through the tier once more; timed mid-way, it read as slow as
0.51x, a compile measured rather than a neighbour). Every call is timed alone; a figure is the
median call. The default's time against the faster of eager and Inductor is the aim's figure:
0.95x or more.

    python benchmarks/zoo_image_models.py                 # every image model, one process each
    python benchmarks/zoo_image_models.py --models resnet,vit --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
TESTS = HERE.parent / "tests"
FORMS = ("eager", "default", "inductor")


def image_model(name: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The zoo model ``name`` (random weights, calibrated norms) and one batch of its images."""
    import torch

    from zoo.checks import BATCH
    from zoo.models import ZOO

    entry = ZOO[name]
    model = entry.build()
    images = torch.randn(BATCH, 3, entry.image_size, entry.image_size)
    return lambda x: model(pixel_values=x).logits, (images,)


def others(name: str) -> list[Callable[[], Any]]:
    """The two other compiled models, settled and ready, each a call without arguments."""
    import torch
    from side_by_side import build, settle

    token, ids = build("qwen3-token")
    tiered = torch.compile(token, backend="npugraph_ex")
    settle(tiered, ids, limit_s=600)
    neighbour, images = image_model("mobilenet_v2" if name == "resnet" else "resnet")
    compiled = torch.compile(neighbour, backend="inductor")
    compiled(*images)
    return [lambda: tiered(*ids), lambda: compiled(*images)]


def timed_rounds(
    forms: dict[str, Callable[..., Any]],
    args: tuple[Any, ...],
    rounds: int,
    calls: int,
    between: list[Callable[[], Any]],
) -> dict[str, float]:
    """Median seconds of a call of each form, over ``rounds`` interleaved rounds of ``calls``
    calls each, every call timed alone and preceded by one call of each of ``between`` (a
    process serving several models in turn)."""
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(rounds):
        for name, fn in forms.items():
            for _ in range(calls):
                for other in between:
                    other()
                started = time.perf_counter()
                fn(*args)
                seconds[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in seconds.items()}


def measure(name: str, rounds: int, calls: int) -> dict[str, Any]:
    """One model's figures, in this process."""
    import torch
    from side_by_side import settle

    model, images = image_model(name)
    with torch.no_grad():
        default = torch.compile(model, backend="npugraph_ex")
        settled = settle(default, images, limit_s=600)
        inductor = torch.compile(model, backend="inductor")
        inductor(*images)
        forms = {"eager": model, "default": default, "inductor": inductor}
        alone = timed_rounds(forms, images, rounds, calls, [])
        neighbours = others(name)
        # Building the neighbours changes transformers' registries, which Dynamo guards: every
        # form compiles again at its next call. Inductor's and eager's are ready at once; the
        # default's new graph starts on its ATen replay, so it is settled again before timing.
        for fn in forms.values():
            fn(*images)
        resettled = settle(default, images, limit_s=600)
        beside = timed_rounds(forms, images, rounds, calls, neighbours)
    return {"model": name, "settled": settled, "resettled": resettled, "alone": alone,
            "beside": beside}  # fmt: skip


def ratio(times: dict[str, float]) -> float:
    """The default's speed against the faster of eager and Inductor."""
    return min(times["eager"], times["inductor"]) / times["default"]


def row(result: dict[str, Any]) -> list[str]:
    alone, beside = result["alone"], result["beside"]
    cells = [result["model"], result["settled"]]
    cells += [f"{alone[form] * 1e3:.2f} / {beside[form] * 1e3:.2f}" for form in FORMS]
    return [*cells, f"{ratio(alone):.2f}x", f"{ratio(beside):.2f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated zoo names (default: every image model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls per form per round")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one model, JSON out
    args = parser.parse_args()
    sys.path[:0] = [str(HERE), str(TESTS)]
    if args.one:
        print(json.dumps(measure(args.one, args.rounds, args.calls)))
        return
    from common import environment, environment_line, format_table

    from zoo.models import ZOO

    names = (
        args.models.split(",") if args.models else [n for n, e in ZOO.items() if e.kind == "vision"]
    )
    results = []
    for name in names:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="zoo_images_")}
        command = [sys.executable, __file__, "--one", name, "--rounds", str(args.rounds)]
        done = subprocess.run(
            [*command, "--calls", str(args.calls)], env=env, capture_output=True, text=True
        )
        if done.returncode:
            print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name}: done", file=sys.stderr)
    headers = ["model", "default settled on", *(f"{f} ms alone / beside" for f in FORMS)]
    headers += ["default vs faster, alone", "beside two others"]
    print(format_table(headers, [row(result) for result in results]))
    print(environment_line(environment()))


if __name__ == "__main__":
    main()
