"""What does fusing written-out attention buy at a batch of one and of more?

Hugging Face's ``eager`` attention is two products around a softmax; the built-in pattern turns
it into one fused kernel (``passes/patterns/eager_attention.py``). With a batch of more than one
and no rotary embedding (GPT-2, BERT, OPT, T5) the products copy their transposed operands first,
and with ``dynamic=True`` batch and length are two symbols: both kept the pattern from matching
until it held the copies and re-checked with every symbol. One process, interleaved: eager and
the ATen replay (``static_kernel_compile=False``, ``dynamic=True``) with the attention fused and
left written out (every other pattern applied to both: the attention pattern alone refuses its
matches while that variant compiles), per model and batch, on one length; each compiled
variant's count of fused attention kernels says whether the pattern applied. ``--kernels`` asks
the same of the kernel tier: each key's graph lowered through Inductor
(``static_kernel_compile=True``), where the written-out attention becomes Inductor's own loops and
the fused one an external call. ``--per-process`` measures as a user meets it: each model, batch
and form in a fresh process with a fresh Inductor cache folder, timed against eager in that
process (the default run has both forms compiled in one process).

    python benchmarks/batched_attention.py --batches 1,4 --length 128
    python benchmarks/batched_attention.py --batches 4 --kernels
    python benchmarks/batched_attention.py --batches 4 --per-process
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from common import (
    add_common_args,
    apply_threads,
    format_table,
    interleaved,
    median,
    print_heading,
    settings_of,
    spread,
    time_calls,
    write_json,
)

NAME = "batched_attention"
FUSED = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def build(name: str) -> torch.nn.Module:
    """A small model of ``name``'s architecture with eager attention and random weights."""
    import transformers as hf

    eager = dict(attn_implementation="eager")
    configs = {
        "gpt2": lambda: hf.GPT2Model(
            hf.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, **eager)
        ),
        "bert": lambda: hf.BertModel(
            hf.BertConfig(
                hidden_size=256,
                intermediate_size=1024,
                num_hidden_layers=4,
                num_attention_heads=4,
                vocab_size=1000,
                **eager,
            )
        ),
    }
    torch.manual_seed(0)
    return configs[name]().eval()


def fused_kernels(graphs: list[torch.fx.GraphModule]) -> int:
    return Counter(str(n.target) for gm in graphs for n in gm.graph.nodes)[FUSED]


@contextlib.contextmanager
def attention_written_out() -> Iterator[None]:
    """While it lasts, the eager-attention pattern finds no fused kernel on any device."""
    from npugraph_ex.passes.patterns import eager_attention

    platform_for = eager_attention.platform_for
    eager_attention.platform_for = lambda device: SimpleNamespace(fused_kernels=frozenset)
    try:
        yield
    finally:
        eager_attention.platform_for = platform_for


def compiled_variant(
    model: torch.nn.Module, fused: bool, kernels: bool, ids: torch.Tensor
) -> tuple[Any, int]:
    """The model on the ATen replay (or Inductor's kernels), its attention fused or written out,
    called once; and how many fused attention kernels its graph holds."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        graphs.append(gm)

    options = {"static_kernel_compile": kernels, "post_grad_custom_post_pass": record}
    compiled = torch.compile(model, backend="npugraph_ex", dynamic=True, options=options)
    with contextlib.nullcontext() if fused else attention_written_out():
        compiled(input_ids=ids)
    return compiled, fused_kernels(graphs)


FORMS = {"fused": True, "written out": False}
"""Each compiled form: whether its attention is fused."""


def time_model(
    name: str, batch: int, length: int, calls: int, repeats: int, kernels: bool, forms: list[str]
) -> dict[str, Any]:
    torch._dynamo.reset()  # each batch compiles its own graphs (a batch of one specializes)
    model = build(name)
    ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(batch))
    variants: dict[str, Callable[[], Any]] = {"eager": lambda: model(input_ids=ids)}
    fused_count = {}
    for label in forms:
        compiled, fused_count[label] = compiled_variant(model, FORMS[label], kernels, ids)
        expected = model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(
            compiled(input_ids=ids).last_hidden_state, expected, atol=1e-4, rtol=1e-4
        )
        variants[label] = lambda compiled=compiled: compiled(input_ids=ids)
    blocks = {label: lambda fn=fn: time_calls(fn, calls) for label, fn in variants.items()}
    times = interleaved(blocks, repeats)
    eager = median(times["eager"])
    return {
        label: {
            "ms": median(t) * 1e3,
            "speedup": eager / median(t),
            "spread": spread(t),
            "fused_attention_kernels": fused_count.get(label),
            "raw_s": t,
        }
        for label, t in times.items()
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME, repeats=9)
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--calls", type=int, default=10, help="calls per timed block")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="each key on Inductor's kernels (static_kernel_compile=True), not the ATen replay",
    )
    parser.add_argument("--forms", default=",".join(FORMS), help="compiled forms, in one process")
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="each model, batch and form in a fresh process and Inductor cache, against eager",
    )
    return parser.parse_args(argv)


def in_fresh_process(args: argparse.Namespace, name: str, batch: int, form: str) -> dict[str, Any]:
    """One model, batch and form timed against eager in a fresh process with a fresh Inductor
    cache folder: the results of its record, the eager row named for the form's process."""
    with tempfile.TemporaryDirectory(prefix="npugraph_ex_attention_") as folder:
        out = Path(folder) / "record.json"
        command = [sys.executable, __file__, "--models", name, "--batches", str(batch)]
        command += ["--forms", form, "--out", str(out), "--length", str(args.length)]
        command += ["--calls", str(args.calls), "--repeats", str(args.repeats)]
        command += ["--kernels"] if args.kernels else []
        command += ["--threads", str(args.threads)] if args.threads else []
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "inductor")}
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        (timed,) = json.loads(out.read_text())["results"].values()
    return {f"eager ({form}'s process)": timed["eager"], form: timed[form]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    apply_threads(args.threads)
    results: dict[str, Any] = {}
    forms = args.forms.split(",")
    with torch.no_grad():
        for name in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                key = f"{name}, batch {batch}"
                if args.per_process:
                    results[key] = {}
                    for form in forms:
                        results[key].update(in_fresh_process(args, name, batch, form))
                    continue
                results[key] = time_model(
                    name, batch, args.length, args.calls, args.repeats, args.kernels, forms
                )
    tier = "Inductor's kernels" if args.kernels else "the ATen replay"
    where = "each form in a fresh process" if args.per_process else "one process"
    print_heading(
        f"intra-op threads: {torch.get_num_threads()}, length {args.length}, on {tier}, {where}"
    )
    rows = [
        [
            key,
            label,
            f"{r['ms']:.2f}",
            f"{r['speedup']:.2f}x",
            f"{r['spread']:.0%}",
            "-" if r["fused_attention_kernels"] is None else str(r["fused_attention_kernels"]),
        ]
        for key, variants in results.items()
        for label, r in variants.items()
    ]
    headers = ["model", "attention", "ms/call", "vs eager", "spread", "fused attention"]
    print(format_table(headers, rows))
    write_json(args.out, NAME, settings_of(args), results)


if __name__ == "__main__":
    main()
