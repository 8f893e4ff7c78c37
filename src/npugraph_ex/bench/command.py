"""``npugraph-ex bench``: its flags, the checks that reject a run before it starts, its order.

The order matters for the figures: the model is built and torch.compile warmed up first, then
each workload runs every variant's first run and the interleaved timing (``runner``), and only
then is anything printed (``output``), so printing never lands inside a timed region.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.bench import output
from npugraph_ex.bench.decode import Decode
from npugraph_ex.bench.environment import apply_threads, environment
from npugraph_ex.bench.growing import PROMPT_TOKENS, Growing, prompt_ids
from npugraph_ex.bench.models import (
    ATTENTION,
    DEFAULT_ATTENTION,
    ModelSource,
    build_model,
    describe_model,
    model_source,
)
from npugraph_ex.bench.one_token import WINDOW_TOKENS, OneToken, Window
from npugraph_ex.bench.precision import PRECISIONS
from npugraph_ex.bench.progress import Progress
from npugraph_ex.bench.records import run_record, write_json
from npugraph_ex.bench.runner import WorkloadResult, run_workload, warm_up
from npugraph_ex.bench.timing import synchronizer
from npugraph_ex.bench.variants import DEFAULTS, VARIANTS, check_names, selection
from npugraph_ex.bench.workload import Workload

NAME = "bench"
WORKLOADS = ("growing", "decode", "token", "window")

DESCRIPTION = """\
Qwen3 causal LM (built from a config, random weights, no download) or a local checkpoint, in
float32, float16 or bfloat16, eager against npugraph_ex and, on request, against other
torch.compile backends, side by side in one process.

workloads:
  growing  greedy generation without a KV cache: every step runs the whole sequence so far, so
           every step is a new length (dynamic=True; npugraph_ex captures one key per length)
  decode   one-token decode step over a StaticCache: one fixed shape (dynamic=False, one key)
  token    one-token forward without a KV cache, fed its own pick (dynamic=False, one key);
           run only when named
  window   32-token forward without a KV cache (a prefill), each step sliding in its pick
           (dynamic=False, one key); run only when named

Per variant: first run / first call (compilation and capture), steady tokens/s and speed-up over
eager (median of interleaved repeats), captured keys, memory, and whether the greedy tokens equal
eager's (in half precision they may part after a near-tie). Prints Markdown tables to stdout,
progress to stderr; writes a JSON record and a PNG."""

EXAMPLES = """\
examples:
  npugraph-ex bench                                   # tiny model, CPU, both workloads
  npugraph-ex bench --peers                           # add aot_eager, inductor, ...
  npugraph-ex bench --model qwen3-0.6b --device cuda --peers
  npugraph-ex bench --workloads decode --variants npugraph_ex --repeats 15
  npugraph-ex bench --model ./my-qwen3 --dtype bfloat16 --device cuda   # a saved checkpoint"""


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (a count of 0 measures nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def name_list(text: str) -> list[str]:
    """An argparse type: comma-separated names (checked against the device later)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``npugraph-ex`` program's subparsers."""
    parser = subparsers.add_parser(
        NAME,
        help="Qwen3 demo: eager vs npugraph_ex (and peers), first-call time, tokens/s, memory",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        type=model_source,
        default="tiny",
        metavar="NAME|PATH",
        help="a Qwen3 config with random weights: tiny (4 layers, 4.5M parameters; default), "
        "micro (2 layers, 0.14M), qwen3-0.6b (the real Qwen3-0.6B architecture: 28 layers, "
        "0.6B); or the path of a local Hugging Face checkpoint folder (config.json and weights, "
        "as save_pretrained writes it), loaded with AutoModelForCausalLM.from_pretrained",
    )
    parser.add_argument(
        "--dtype",
        choices=list(PRECISIONS),
        default="float32",
        help="dtype of the weights, and so of every variant's compute, eager's included "
        "(default float32); in float16 and bfloat16 greedy tokens may part from eager's after "
        "a near-tie",
    )
    parser.add_argument(
        "--attn",
        choices=ATTENTION,
        default=DEFAULT_ATTENTION,
        help=f"attention implementation (transformers' attn_implementation; default "
        f"{DEFAULT_ATTENTION}, what transformers picks for Qwen3 by itself)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the model and inputs live (default cpu); cuda synchronises before every "
        "clock read",
    )
    parser.add_argument(
        "--workloads",
        type=name_list,
        default=["growing", "decode"],
        metavar="NAMES",
        help="comma-separated workloads to run: growing, decode, token, window (default "
        "growing,decode)",
    )
    defaults = "; ".join(f"{w}: {', '.join(v)}" for w, v in DEFAULTS.items())
    parser.add_argument(
        "--variants",
        type=name_list,
        default=None,
        metavar="NAMES",
        help="comma-separated variants for every workload (eager always runs: it is the "
        f"baseline). Default {defaults}. Others: npugraph_ex+background, aot_eager, inductor, "
        "inductor+async (Inductor's async+subprocess compile mode), inductor+cpp_wrapper (cpu), "
        "reduce-overhead, cudagraphs (cuda)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add aot_eager and inductor, plus inductor+cpp_wrapper on cpu or "
        'mode="reduce-overhead" and cudagraphs on cuda',
    )
    parser.add_argument(
        "--tokens",
        type=positive_int,
        default=32,
        metavar="N",
        help="growing: new tokens per generation, each a new sequence length and so a new "
        "captured key (default 32)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=64,
        metavar="N",
        help="decode, token and window: steps per timed block, and greedy tokens checked "
        "against eager (default 64; decode: less than --max-cache-len)",
    )
    parser.add_argument(
        "--max-cache-len",
        type=positive_int,
        default=128,
        metavar="N",
        help="decode: StaticCache length (default 128)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        metavar="N",
        help="interleaved timed rounds after one warm-up round; figures are their median "
        "(default 5)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch intra-op threads (default: torch's own)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the random weights and the prompt (default 0)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results") / "bench.json",
        metavar="PATH",
        help="JSON record to write (default bench-results/bench.json)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path("bench-results") / "bench.png",
        metavar="PATH",
        help="PNG chart to write, one panel per workload (default bench-results/bench.png; "
        "needs matplotlib)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the chart")
    parser.set_defaults(run=run, parser=parser)
    return parser


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Reject what cannot run before any model is built (argparse exits with status 2)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device cuda needs a CUDA device, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); run with --device cpu or on a machine with a GPU"
        )
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown or not args.workloads:
        parser.error(
            f"--workloads takes {', '.join(WORKLOADS)} (comma-separated), got {unknown or 'none'}"
        )
    if args.variants is not None:
        problem = check_names(args.variants, args.device)
        if problem:
            parser.error(f"--variants: {problem}")
    if "decode" in args.workloads and args.steps >= args.max_cache_len:
        parser.error(
            f"--steps must be less than --max-cache-len, got {args.steps} >= {args.max_cache_len}"
        )


def settings(args: argparse.Namespace, chosen: dict[str, list[str]]) -> dict[str, Any]:
    """The run's settings as the JSON record keeps them, with the variants each workload ran."""
    keys = ("model", "dtype", "attn", "device", "workloads", "variants", "peers", "tokens")
    keys += ("steps", "max_cache_len", "repeats", "threads", "seed", "out", "plot", "no_plot")
    record: dict[str, Any] = {key: getattr(args, key) for key in keys}
    record["variants_by_workload"] = chosen
    return {k: str(v) if isinstance(v, Path | ModelSource) else v for k, v in record.items()}


def workloads(model: torch.nn.Module, args: argparse.Namespace) -> list[Workload]:
    """The workloads ``--workloads`` names, in that order, on ``model``."""
    sync = synchronizer(args.device)
    built = {
        "growing": lambda: Growing(
            model,
            prompt_ids(model.config.vocab_size, PROMPT_TOKENS, args.seed, args.device),
            args.tokens,
            sync,
        ),
        "decode": lambda: Decode(model, args.steps, args.max_cache_len, args.device, sync),
        "token": lambda: OneToken(
            model, prompt_ids(model.config.vocab_size, 1, args.seed, args.device), args.steps, sync
        ),
        "window": lambda: Window(
            model,
            prompt_ids(model.config.vocab_size, WINDOW_TOKENS, args.seed, args.device),
            args.steps,
            sync,
        ),
    }
    return [built[name]() for name in args.workloads]


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; the exit status."""
    check(args, args.parser)
    apply_threads(args.threads)
    env = environment(args.device)
    progress = Progress()
    chosen = {w: selection(w, args.device, args.variants, args.peers) for w in args.workloads}
    positions = max(PROMPT_TOKENS + args.tokens, args.max_cache_len)
    precision = PRECISIONS[args.dtype]
    what = "loading" if args.model.checkpoint else "building Qwen3"
    with progress.phase(f"{what} {args.model} in {args.dtype} on {args.device}"):
        model = build_model(
            args.model,
            precision,
            args.attn,
            seed=args.seed,
            device=args.device,
            positions=positions,
        )
    results: list[WorkloadResult] = []
    with torch.no_grad():
        if any(VARIANTS[n].compiled for w in args.workloads for n in chosen[w]):
            with progress.phase("warming up torch.compile"):
                warm_up(args.device)
        for workload in workloads(model, args):
            results.append(
                run_workload(
                    workload,
                    chosen[workload.name],
                    repeats=args.repeats,
                    device=args.device,
                    progress=progress,
                )
            )
    model_info = describe_model(args.model, model, args.seed)
    output.report(env, model_info, results, args)
    record = run_record(NAME, settings(args, chosen), command=["npugraph-ex", *args.argv], env=env)
    record["model"] = model_info
    record["workloads"] = {r.workload.name: r.record() for r in results}
    output.wrote(write_json(args.out, record))
    if not args.no_plot:
        output.plot(results, args.plot, env, model_info, args.repeats)
    return 0
