"""How much faster is a fixed-shape Qwen3 decode step under npugraph_ex than in eager mode?

One decode step (one token, ``StaticCache``) of a Qwen3 causal LM built from a config with random
weights, timed several ways in one interleaved loop:

- eager: the plain step;
- npugraph_ex: ``torch.compile(step, backend="npugraph_ex", fullgraph=True)``;
- capture manager: the graph's capture manager called directly, as the wrappers call it;
- replay-only: the captured graph's bare ``replay()``, found through the capture manager; the gap
  between it and npugraph_ex is what Dynamo's guards and the wrappers around the graph cost;
- step loop: the same recorded steps run by a plain Python loop instead of the replay's generated
  function, which shows what generating it saves;
- guards skipped: the npugraph_ex step under ``torch.compiler.set_stance("default",
  skip_guard_eval_unsafe=True)``, which shows what Dynamo's guard check costs (unsafe in general;
  here every call has the same kinds of inputs as the compiled one);
- module guards skipped: the step compiled with ``options={"guard_filter_fn":
  torch.compiler.skip_guard_on_all_nn_modules_unsafe}``, which drops Dynamo's guards on the model's
  modules and keeps those on the inputs (the KV cache, the token, the position);
- no fusion: the step compiled with ``pattern_fusion_pass=False``, the other passes on; its logits
  are compared with Dynamo alone's, which they must equal bit for bit;
- no passes: the step compiled with every optimisation pass off, called as the user calls it, and
  the same with the modules' guards skipped;
- with ``--static-kernels``, the same three for the step compiled with ``static_kernel_compile``
  (its bare call runs the key's Inductor kernels).

Before timing, the compiled step's logits are compared with eager (and with Dynamo alone,
``backend="eager"``, which shows how much of any difference tracing itself causes), and a few
greedy steps check that both pick the same tokens.

    python benchmarks/qwen3_decode_step.py                 # tiny preset
    python benchmarks/qwen3_decode_step.py --preset all --plot docs/figures/qwen3_decode_step.png
    python benchmarks/qwen3_decode_step.py --static-kernels --no-dynamo-reference
    python benchmarks/qwen3_decode_step.py --family qwen2   # Qwen2: q, k, v with a bias
    python benchmarks/qwen3_decode_step.py --dtype bfloat16 --attn eager   # the seed's model

``--family qwen2`` builds Qwen2 in the same sizes (the same decoder with a bias on the q, k and v
projections and no q/k norms); ``--family mistral`` builds Mistral, whose ``StaticCache`` layers
are sliding-window layers that count tokens in a Python int.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from common import (
    QWEN3_MODELS,
    QWEN3_PRESETS,
    add_common_args,
    apply_threads,
    aten_self_times,
    captured_graph,
    environment,
    format_table,
    interleaved,
    kernels_per_replay,
    live_graph_numbers,
    manager_arguments,
    median,
    print_heading,
    scaled,
    settings_of,
    spread,
    step_loop,
    with_inputs,
    write_json,
)
from transformers import (
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    StaticCache,
)

from npugraph_ex.bench.decode import cache_keyword
from npugraph_ex.bench.models import cast_parameters

NAME = "qwen3_decode_step"


VARIANTS = ("eager", "npugraph_ex", "replay-only")

FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}
"""``--family``: the config and model classes a preset's sizes build."""

NO_PASSES = {
    "remove_noop_ops": False,
    "pattern_fusion_pass": False,
    "inplace_pass": False,
    "input_inplace_pass": False,
}
"""Every optimisation pass off: the graph AOTAutograd produced, captured as it is."""

NO_FUSION = {"pattern_fusion_pass": False}
"""No fusion pattern: the graph's own kernels, with no-ops removed and writes made in place."""

STATIC_KERNELS = {"static_kernel_compile": True}
"""The key's graph compiled by Inductor for its shapes (``--static-kernels``)."""


def without_module_guards(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus PyTorch's guard filter that skips the guards on ``nn.Module`` state.

    A new dict on every call: ``torch.compile`` pops ``guard_filter_fn`` from the one it gets.
    """
    return {**options, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}


@dataclass
class Bench:
    """One preset's model, its steps and their caches."""

    preset: str
    config: PretrainedConfig
    model: torch.nn.Module
    max_cache_len: int
    step: Callable[..., torch.Tensor] = field(init=False)
    compiled: Callable[..., torch.Tensor] = field(init=False)
    unfused: Callable[..., torch.Tensor] = field(init=False)
    unoptimised: Callable[..., torch.Tensor] = field(init=False)
    unguarded_modules: Callable[..., torch.Tensor] = field(init=False)
    unoptimised_unguarded_modules: Callable[..., torch.Tensor] = field(init=False)
    static: Callable[..., torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        model, keyword = self.model, cache_keyword(self.model)

        def step(ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache) -> torch.Tensor:
            return model(
                input_ids=ids, cache_position=pos, use_cache=True, **{keyword: cache}
            ).logits

        def same_step(ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache) -> torch.Tensor:
            # Its own code object: Dynamo keeps its guards apart from ``step``'s.
            return step(ids, pos, cache)

        def static_step(ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache) -> torch.Tensor:
            return step(ids, pos, cache)

        def unfused_step(ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache) -> torch.Tensor:
            return step(ids, pos, cache)

        def filtered_step(ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache) -> torch.Tensor:
            return step(ids, pos, cache)

        def filtered_same_step(
            ids: torch.Tensor, pos: torch.Tensor, cache: StaticCache
        ) -> torch.Tensor:
            return step(ids, pos, cache)

        self.step = step
        self.static = torch.compile(
            static_step, backend="npugraph_ex", fullgraph=True, options=STATIC_KERNELS
        )
        self.compiled = torch.compile(step, backend="npugraph_ex", fullgraph=True)
        self.unfused = torch.compile(
            unfused_step, backend="npugraph_ex", fullgraph=True, options=NO_FUSION
        )
        self.unoptimised = torch.compile(
            same_step, backend="npugraph_ex", fullgraph=True, options=NO_PASSES
        )
        self.unguarded_modules = torch.compile(
            filtered_step, backend="npugraph_ex", fullgraph=True, options=without_module_guards({})
        )
        self.unoptimised_unguarded_modules = torch.compile(
            filtered_same_step,
            backend="npugraph_ex",
            fullgraph=True,
            options=without_module_guards(NO_PASSES),
        )

    def new_cache(self, batch: int = 1) -> StaticCache:
        """A static cache of ``batch`` sequences, initialised up front as a prefill would, so the
        step has one graph."""
        cfg = self.config
        cache = StaticCache(config=cfg, max_cache_len=self.max_cache_len)
        cache.early_initialization(
            batch, cfg.num_key_value_heads, cfg.head_dim, self.model.dtype, torch.device("cpu")
        )
        return cache


def build(
    preset: str,
    max_cache_len: int,
    seed: int,
    family: str = "qwen3",
    dtype: str = "float32",
    attn: str = "sdpa",
) -> Bench:
    """The preset's model with random weights; parameters in ``dtype`` (buffers as built, as
    ``from_pretrained`` keeps them), attention as ``attn`` (transformers' implementation)."""
    config_class, model_class = FAMILIES[family]
    positions = max(max_cache_len, 512)
    config = config_class(
        **{**QWEN3_MODELS[preset], "max_position_embeddings": positions},
        attn_implementation=attn,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cast_parameters(model_class(config).eval(), getattr(torch, dtype))
    return Bench(preset, config, model, max_cache_len)


def greedy_tokens(fn: Callable[..., torch.Tensor], cache: StaticCache, steps: int) -> list[int]:
    """Tokens of ``steps`` greedy decode steps from token 1, each fed the previous pick."""
    cache.reset()
    ids, tokens = torch.tensor([[1]]), []
    for position in range(steps):
        ids = fn(ids, torch.tensor([position]), cache)[:, -1:].argmax(-1)
        tokens.append(int(ids))
    cache.reset()
    return tokens


def forced_logits(
    fn: Callable[..., torch.Tensor], cache: StaticCache, tokens: list[int]
) -> list[torch.Tensor]:
    """Logits (cloned) of ``fn`` fed token 1 and then ``tokens[:-1]``, one step each."""
    cache.reset()
    inputs = [1, *tokens[:-1]]
    logits = [
        fn(torch.tensor([[t]]), torch.tensor([p]), cache).clone() for p, t in enumerate(inputs)
    ]
    cache.reset()
    return logits


def compare(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict[str, Any]:
    return {
        "max_abs_diff": max(float((r - g).abs().max()) for r, g in zip(ref, got, strict=True)),
        "equal": all(torch.equal(r, g) for r, g in zip(ref, got, strict=True)),
    }


@dataclass
class Numerics:
    """The numerics check's findings, and what the Dynamo-alone comparison needs later."""

    result: dict[str, Any]
    eager_tokens: list[int]
    eager_logits: list[torch.Tensor]
    logits: list[torch.Tensor]
    unfused_logits: list[torch.Tensor]


def check_numerics(
    bench: Bench, cache: StaticCache, unfused_cache: StaticCache, steps: int
) -> Numerics:
    """Compiled logits (with and without fusion) against eager on the same inputs, and
    greedy-token agreement.

    Logits are compared with both steps fed eager's greedy tokens, so one early difference in a
    pick cannot cascade.
    """
    eager_tokens = greedy_tokens(bench.step, bench.new_cache(), steps)
    eager_logits = forced_logits(bench.step, bench.new_cache(), eager_tokens)
    logits = forced_logits(bench.compiled, cache, eager_tokens)
    tokens = greedy_tokens(bench.compiled, cache, steps)
    unfused_logits = forced_logits(bench.unfused, unfused_cache, eager_tokens)
    result: dict[str, Any] = {
        "steps": steps,
        "vs_eager": compare(eager_logits, logits),
        "no_fusion_vs_eager": compare(eager_logits, unfused_logits),
        "greedy_tokens_agree": sum(a == b for a, b in zip(eager_tokens, tokens, strict=True)),
    }
    return Numerics(result, eager_tokens, eager_logits, logits, unfused_logits)


def compare_dynamo_alone(bench: Bench, numerics: Numerics) -> None:
    """Add Dynamo alone (``backend="eager"``) to the comparison: eager vs it, it vs npugraph_ex.

    Run after timing: a second compiled entry for the same code would make every later call of
    the compiled step check one more set of guards.
    """
    dynamo = torch.compile(bench.step, backend="eager", fullgraph=True)
    dynamo_logits = forced_logits(dynamo, bench.new_cache(), numerics.eager_tokens)
    numerics.result["dynamo_eager_vs_eager"] = compare(numerics.eager_logits, dynamo_logits)
    numerics.result["vs_dynamo_eager"] = compare(dynamo_logits, numerics.logits)
    numerics.result["no_fusion_vs_dynamo_eager"] = compare(dynamo_logits, numerics.unfused_logits)


def step_block(
    fn: Callable[..., Any], cache: StaticCache, steps: int, batch: int = 1
) -> Callable[[], float]:
    """One timed block: ``steps`` decode steps of ``batch`` sequences from an empty cache;
    seconds per step."""
    ids = torch.ones(batch, 1, dtype=torch.long)
    positions = [torch.tensor([p]) for p in range(steps)]

    def block() -> float:
        cache.reset()
        start = time.perf_counter()
        for pos in positions:
            fn(ids, pos, cache)
        return (time.perf_counter() - start) / steps

    return block


def unguarded(block: Callable[[], float]) -> Callable[[], float]:
    """``block`` run with Dynamo's guard check skipped."""

    def run() -> float:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return block()

    return run


def bare_block(
    call: Callable[[], Any],
    cache: StaticCache,
    steps: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[], float]:
    """One timed block of ``steps`` calls of ``call``, which advances ``cache`` as a step does;
    seconds per call on ``clock``."""

    def block() -> float:
        cache.reset()
        start = clock()
        for _ in range(steps):
            call()
        return (clock() - start) / steps

    return block


def bare_calls(
    manager: Any, call: Callable[[], Any], cache: StaticCache
) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any] | None]:
    """The manager alone, its graph's bare replay and (for the replay engine's graphs) its steps
    in a plain loop, on the arguments ``call`` gives the manager (the bare runs copy them in
    first, as a replay does)."""
    manager, args = manager_arguments([manager], call)
    cache.reset()
    graph = next(iter(manager.entries.values())).graph
    steps = with_inputs(manager, args, step_loop(graph)) if hasattr(graph, "steps") else None
    return lambda: manager(list(args)), with_inputs(manager, args, graph.replay), steps


def static_blocks(bench: Bench, steps: int) -> dict[str, Callable[[], float]]:
    """The step with ``static_kernel_compile``: compiled call, its capture manager, bare kernels."""
    before = live_graph_numbers()
    cache = bench.new_cache()
    bench.static(torch.tensor([[1]]), torch.tensor([0]), cache)
    manager, _ = captured_graph(before)
    through_manager, bare, _ = bare_calls(manager, first_step(bench.static, cache), cache)
    return {
        "static kernels": step_block(bench.static, cache, steps),
        "static kernels, manager": bare_block(through_manager, cache, steps),
        "static kernels only": bare_block(bare, cache, steps),
    }


def first_step(fn: Callable[..., Any], cache: StaticCache) -> Callable[[], Any]:
    return lambda: fn(torch.tensor([[1]]), torch.tensor([0]), cache)


def run_preset(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Check numerics, then time eager / npugraph_ex / replay-only interleaved."""
    bench = build(preset, args.max_cache_len, args.seed, args.family, args.dtype, args.attn)
    before = live_graph_numbers()
    eager_cache, compiled_cache, unfused_cache = (bench.new_cache() for _ in range(3))
    start = time.perf_counter()
    bench.compiled(torch.tensor([[1]]), torch.tensor([0]), compiled_cache)
    first_call_s = time.perf_counter() - start
    numerics = check_numerics(bench, compiled_cache, unfused_cache, args.check_steps)
    manager, graph = captured_graph(before)
    before_unoptimised = live_graph_numbers()
    unoptimised_cache = bench.new_cache()
    bench.unoptimised(torch.tensor([[1]]), torch.tensor([0]), unoptimised_cache)
    unoptimised_manager, unoptimised_graph = captured_graph(before_unoptimised)
    through_manager, replay_only, steps_only = bare_calls(
        manager, first_step(bench.compiled, compiled_cache), compiled_cache
    )
    _, unoptimised_replay, _ = bare_calls(
        unoptimised_manager, first_step(bench.unoptimised, unoptimised_cache), unoptimised_cache
    )
    unguarded_cache, unoptimised_unguarded_cache = bench.new_cache(), bench.new_cache()
    bench.unguarded_modules(torch.tensor([[1]]), torch.tensor([0]), unguarded_cache)
    bench.unoptimised_unguarded_modules(
        torch.tensor([[1]]), torch.tensor([0]), unoptimised_unguarded_cache
    )
    blocks = {
        "eager": step_block(bench.step, eager_cache, args.steps),
        "npugraph_ex": step_block(bench.compiled, compiled_cache, args.steps),
        "guards skipped": unguarded(step_block(bench.compiled, compiled_cache, args.steps)),
        "module guards skipped": step_block(bench.unguarded_modules, unguarded_cache, args.steps),
        "no fusion": step_block(bench.unfused, unfused_cache, args.steps),
        "no passes": step_block(bench.unoptimised, unoptimised_cache, args.steps),
        "no passes, module guards skipped": step_block(
            bench.unoptimised_unguarded_modules, unoptimised_unguarded_cache, args.steps
        ),
        "capture manager": bare_block(through_manager, compiled_cache, args.steps),
        "replay-only": bare_block(replay_only, compiled_cache, args.steps),
        "step loop": bare_block(steps_only, compiled_cache, args.steps),
        "replay-only, no passes": bare_block(unoptimised_replay, unoptimised_cache, args.steps),
    }
    if args.static_kernels:
        blocks.update(static_blocks(bench, args.steps))
    times = interleaved(blocks, args.repeats, warmup=args.warmup)
    advanced = int(compiled_cache.layers[0].cumulative_length)
    compiled_cache.reset()
    kernels, profiled_wall = aten_self_times(replay_only, args.steps)
    compiled_cache.reset()
    if args.dynamo_reference:
        compare_dynamo_alone(bench, numerics)
    return {
        "preset": preset,
        "model": {
            "family": args.family,
            "dtype": args.dtype,
            "attn": args.attn,
            **QWEN3_PRESETS[preset],
            "parameters": sum(p.numel() for p in bench.model.parameters()),
        },
        "first_call_s": round(first_call_s, 3),
        "numerics": numerics.result,
        "replay_advances_cache": advanced == args.steps,
        "stats": manager.stats.summary(),
        "kernels_per_replay": kernels_per_replay(manager.stats.summary(), graph),
        "kernels_per_replay_no_passes": unoptimised_graph.kernel_count,
        "per_repeat_ms": {name: scaled(ts, 1e3) for name, ts in times.items()},
        "median_ms": {name: round(median(ts) * 1e3, 4) for name, ts in times.items()},
        "spread": {name: round(spread(ts), 3) for name, ts in times.items()},
        "profiled_replay_ms": round(profiled_wall * 1e3, 4),
        "replay_kernel_self_ms": round(sum(kernels.values()) * 1e3, 4),
        "replay_kernel_self_ms_by_op": {
            op: round(t * 1e3, 4) for op, t in sorted(kernels.items(), key=lambda kv: -kv[1])
        },
    }


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def profile_shares(result: dict[str, Any]) -> tuple[float, float]:
    """Shares of a profiled replay's wall time spent in ATen kernels, and in matrix products."""
    wall = result["profiled_replay_ms"]
    by_op = result["replay_kernel_self_ms_by_op"]
    matmul = sum(t for op, t in by_op.items() if op in MATMULS)
    return result["replay_kernel_self_ms"] / wall, matmul / wall


TIMING_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "eager ms": lambda r: r["median_ms"]["eager"],
    "npugraph_ex ms": lambda r: r["median_ms"]["npugraph_ex"],
    "replay-only ms": lambda r: r["median_ms"]["replay-only"],
    "step loop ms": lambda r: r["median_ms"]["step loop"],
    "guards skipped ms": lambda r: r["median_ms"]["guards skipped"],
    "kernel share": lambda r: f"{profile_shares(r)[0]:.0%}",
    "matmul share": lambda r: f"{profile_shares(r)[1]:.0%}",
    "speed-up": lambda r: f"{r['median_ms']['eager'] / r['median_ms']['npugraph_ex']:.2f}x",
    "eager/replay": lambda r: f"{r['median_ms']['eager'] / r['median_ms']['replay-only']:.2f}x",
    "guards+wrappers ms": lambda r: r["median_ms"]["npugraph_ex"] - r["median_ms"]["replay-only"],
    "of which manager ms": lambda r: (
        r["median_ms"]["capture manager"] - r["median_ms"]["replay-only"]
    ),
    "kernels/replay": lambda r: r["kernels_per_replay"],
    "captures": lambda r: r["stats"]["captures"],
    "replays": lambda r: r["stats"]["replays"],
    "spread": lambda r: f"{max(r['spread'].values()) * 100:.0f}%",
}


def speedup(variant: str) -> Callable[[dict[str, Any]], str]:
    """A column: eager's median over ``variant``'s."""
    return lambda r: f"{r['median_ms']['eager'] / r['median_ms'][variant]:.2f}x"


GUARD_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "eager ms": lambda r: r["median_ms"]["eager"],
    "npugraph_ex ms": lambda r: r["median_ms"]["npugraph_ex"],
    "module guards skipped ms": lambda r: r["median_ms"]["module guards skipped"],
    "speed-up": speedup("npugraph_ex"),
    "module guards skipped": speedup("module guards skipped"),
    "no fusion ms": lambda r: r["median_ms"]["no fusion"],
    "no fusion: speed-up": speedup("no fusion"),
    "no passes ms": lambda r: r["median_ms"]["no passes"],
    "no passes: replay ms": lambda r: r["median_ms"]["replay-only, no passes"],
    "no passes: kernels": lambda r: r["kernels_per_replay_no_passes"],
    "no passes: speed-up": speedup("no passes"),
    "no passes, module guards skipped": speedup("no passes, module guards skipped"),
}
"""The step without the fusion patterns, the step with every pass off, and both steps with
Dynamo's guards on the model's modules skipped (``guard_filter_fn``)."""


STATIC_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "eager ms": lambda r: r["median_ms"]["eager"],
    "static kernels ms": lambda r: r["median_ms"]["static kernels"],
    "kernels only ms": lambda r: r["median_ms"]["static kernels only"],
    "speed-up": lambda r: f"{r['median_ms']['eager'] / r['median_ms']['static kernels']:.2f}x",
    "eager/kernels": lambda r: (
        f"{r['median_ms']['eager'] / r['median_ms']['static kernels only']:.2f}x"
    ),
    "outside the manager ms": lambda r: (
        r["median_ms"]["static kernels"] - r["median_ms"]["static kernels, manager"]
    ),
}
"""``--static-kernels``: the same step with ``static_kernel_compile``; outside the manager =
compiled call - capture manager called directly (Dynamo's frame and AOTAutograd's wrapper)."""


def numerics_row(r: dict[str, Any]) -> list[Any]:
    n = r["numerics"]
    dynamo = n.get("dynamo_eager_vs_eager")
    return [
        r["preset"],
        f"{n['vs_eager']['max_abs_diff']:.3g}",
        n["vs_eager"]["equal"],
        f"{dynamo['max_abs_diff']:.3g}" if dynamo else "-",
        n.get("vs_dynamo_eager", {}).get("equal", "-"),
        n.get("no_fusion_vs_dynamo_eager", {}).get("equal", "-"),
        f"{n['greedy_tokens_agree']}/{n['steps']}",
    ]


NUMERICS_HEADERS = ["preset", "max |diff| vs eager", "torch.equal", "Dynamo alone: max |diff|",
                    "equal to Dynamo alone", "no fusion: equal to Dynamo alone",
                    "greedy tokens agree"]  # fmt: skip

EXPLANATION = """
speed-up = eager / npugraph_ex; eager/replay = the speed-up if Dynamo's guards and the wrappers
around the graph cost nothing; guards+wrappers = npugraph_ex - replay-only, of which the capture
manager (called directly: key lookup, address checks, input copies) costs capture manager - replay.
kernel share, matmul share = the part of a replay's time (under torch.profiler) spent in ATen ops
(self CPU time), and in matrix products (mm, addmm, bmm).
step loop = the replay's steps run by a plain loop; guards skipped = the npugraph_ex step with
Dynamo's guard check skipped (torch.compiler.set_stance, skip_guard_eval_unsafe=True).
no fusion = the same step compiled with pattern_fusion_pass=False (the other passes on);
no passes = the same step compiled with every optimisation pass off (called, and its bare replay);
module guards skipped = compiled with options={"guard_filter_fn":
torch.compiler.skip_guard_on_all_nn_modules_unsafe}: no guards on the model's modules, those on
the inputs kept.
spread = (max - min) / median of the noisiest variant's repeats.
"Dynamo alone" is torch.compile(step, backend="eager"): tracing without npugraph_ex."""


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print_heading(
        f"{args.family} one-token decode step in {args.dtype}, {args.attn} attention, "
        f"StaticCache max_cache_len={args.max_cache_len}; median of {args.repeats} interleaved "
        f"repeats of {args.steps} steps each"
    )
    rows = [[r["preset"], *(cell(r) for cell in TIMING_COLUMNS.values())] for r in results]
    print(format_table(["preset", *TIMING_COLUMNS], rows))
    print()
    guard_rows = [[r["preset"], *(cell(r) for cell in GUARD_COLUMNS.values())] for r in results]
    print(format_table(["preset", *GUARD_COLUMNS], guard_rows))
    if args.static_kernels:
        print()
        static_rows = [
            [r["preset"], *(cell(r) for cell in STATIC_COLUMNS.values())] for r in results
        ]
        print(format_table(["preset", *STATIC_COLUMNS], static_rows))
    print()
    print(format_table(NUMERICS_HEADERS, [numerics_row(r) for r in results]))
    print(EXPLANATION)


def plot(results: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    """One panel per preset: eager, npugraph_ex and replay-only latency per step."""
    from common import Panel, bar_panels

    panels = []
    for r in results:
        params = r["model"]["parameters"] / 1e6
        layers = r["model"]["num_hidden_layers"]
        title = f"{r['preset']}: {layers} layers, {params:.1f}M parameters"
        panels.append(Panel(title, {v: r["per_repeat_ms"][v] for v in VARIANTS}))
    env = environment()
    title = (
        f"{args.family} one-token decode step (StaticCache {args.max_cache_len}): "
        "eager vs npugraph_ex\n"
        f"{env['device']}, {env['cores']} cores, {env['torch_threads']} torch threads, torch "
        f"{env['torch']}, transformers {env['transformers']}\n"
        f"median of {args.repeats} interleaved repeats, whiskers: interquartile range; "
        "labels: ms per step, speed-up over eager"
    )
    bar_panels(panels, path, title=title, unit="ms", ylabel="ms per decode step (lower is better)")


def add_step_args(parser: argparse.ArgumentParser) -> None:
    """``--preset``, ``--family``, ``--max-cache-len``, ``--steps``, ``--seed``: what builds and
    times a step."""
    parser.add_argument("--preset", choices=[*QWEN3_PRESETS, "all"], default="tiny")
    parser.add_argument(
        "--family",
        choices=list(FAMILIES),
        default="qwen3",
        help="model the preset's sizes build (qwen2: q, k and v projections with a bias; "
        "mistral: a sliding-window cache)",
    )
    parser.add_argument("--max-cache-len", type=int, default=128, help="StaticCache length")
    parser.add_argument(
        "--steps", type=int, default=64, help="decode steps per timed block (< max-cache-len)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument(
        "--attn", choices=("sdpa", "eager"), default="sdpa", help="transformers' attention"
    )


def each_preset(
    args: argparse.Namespace, run: Callable[[str, argparse.Namespace], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``run`` on the chosen preset (every preset for ``--preset all``), without autograd."""
    presets = list(QWEN3_PRESETS) if args.preset == "all" else [args.preset]
    with torch.no_grad():
        return [run(preset, args) for preset in presets]


def parse_step_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, name: str, repeats: int
) -> argparse.Namespace:
    """Parse a step benchmark's arguments (``add_step_args`` already added, and its own), with the
    common ones; ``--steps`` must fit in the cache."""
    add_common_args(parser, name, repeats=repeats)
    args = parser.parse_args(argv)
    if not 0 < args.steps < args.max_cache_len:
        parser.error("--steps must be >= 1 and < --max-cache-len")
    return args


def run_and_record(
    args: argparse.Namespace,
    name: str,
    run: Callable[[str, argparse.Namespace], dict[str, Any]],
    report: Callable[[list[dict[str, Any]], argparse.Namespace], None],
) -> list[dict[str, Any]]:
    """``run`` each preset, print the ``report``, write the JSON record; the results."""
    apply_threads(args.threads)
    results = each_preset(args, run)
    report(results, args)
    write_json(args.out, name, settings_of(args), results)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_step_args(parser)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds before timing")
    parser.add_argument("--check-steps", type=int, default=8, help="steps of the numerics check")
    parser.add_argument(
        "--no-dynamo-reference",
        dest="dynamo_reference",
        action="store_false",
        help='skip comparing with torch.compile(backend="eager")',
    )
    parser.add_argument(
        "--static-kernels",
        action="store_true",
        help="also time the step with static_kernel_compile (compiles through Inductor)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    args = parse_step_args(parser, argv, NAME, repeats=15)
    if not 0 < args.check_steps < args.max_cache_len:
        parser.error("--check-steps must be >= 1 and < --max-cache-len")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = run_and_record(args, NAME, run_preset, report)
    if args.plot is not None:
        plot(results, args.plot, args)


if __name__ == "__main__":
    main()
