"""The pure helpers behind ``npugraph-ex bench``: variants, token agreement, records, memory."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from npugraph_ex.bench.decode import Decode
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since, summarise
from npugraph_ex.bench.growing import Growing
from npugraph_ex.bench.memory import MemoryMeter, resident_bytes
from npugraph_ex.bench.one_token import OneToken, Window
from npugraph_ex.bench.records import run_record, write_json
from npugraph_ex.bench.timing import interleaved
from npugraph_ex.bench.variants import VARIANTS, check_names, own_code, selection
from npugraph_ex.bench.workload import Generation, agreement


def test_eager_always_runs_first_and_peers_depend_on_the_device() -> None:
    assert selection("growing", "cpu", None, peers=False) == [
        "eager", "npugraph_ex", "npugraph_ex+aten", "npugraph_ex+cache_compile",
    ]  # fmt: skip
    assert selection("decode", "cpu", ["npugraph_ex"], peers=False) == ["eager", "npugraph_ex"]
    cpu = selection("decode", "cpu", None, peers=True)
    cuda = selection("decode", "cuda", None, peers=True)
    assert cpu[-3:] == ["aot_eager", "inductor", "inductor+cpp_wrapper"]
    assert cuda[-4:] == ["aot_eager", "inductor", "reduce-overhead", "cudagraphs"]
    assert "npugraph_ex+static_kernels" in cpu


def test_variant_names_are_checked_against_the_device() -> None:
    assert check_names(["eager", "inductor+cpp_wrapper"], "cpu") is None
    assert "runs on cpu only" in check_names(["inductor+cpp_wrapper"], "cuda")
    assert "unknown variant 'nope'" in check_names(["nope"], "cpu")


def test_workload_options_reach_npugraph_ex_variants_only() -> None:
    extra = {"capture_limit": 7}
    static = VARIANTS["npugraph_ex+static_kernels"].compile_args(
        dynamic=True, npugraph_options=extra
    )
    assert static == {
        "fullgraph": True,
        "dynamic": True,
        "backend": "npugraph_ex",
        "options": {"capture_limit": 7, "static_kernel_compile": True},
    }
    peer = VARIANTS["reduce-overhead"].compile_args(dynamic=False, npugraph_options=extra)
    assert peer == {"fullgraph": True, "dynamic": False, "mode": "reduce-overhead"}
    assert not VARIANTS["eager"].compiled


def test_each_variant_compiles_its_own_code_object() -> None:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list as cache_entries

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    first, second = own_code(step, "npugraph_ex"), own_code(step, "aot_eager")
    assert first.__code__ is not second.__code__
    assert first.__name__ == "step_npugraph_ex"
    x = torch.arange(4.0)
    assert torch.equal(torch.compile(first, backend="eager")(x), step(x))
    assert torch.equal(torch.compile(second, backend="aot_eager")(x), step(x))
    assert len(cache_entries(first.__code__)) == 1
    assert len(cache_entries(second.__code__)) == 1
    assert len(cache_entries(step.__code__)) == 0


def test_a_cache_compile_variant_runs_through_a_cache_folder_it_removes() -> None:
    """The step, wrapped as a module's method, compiles once and is a cache hit afterwards; its
    folder goes with the compiled step."""

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    variant = VARIANTS["npugraph_ex+cache_compile"]
    cached = variant.prepare(step, variant.compile_args(dynamic=False, npugraph_options={}))
    x = torch.randn(3)
    with torch.no_grad():
        results = [cached(x).clone() for _ in range(3)]
    assert all(torch.equal(result, step(x)) for result in results)
    info = cached.cache_info()
    assert (info["compiled"], info["saved"], info["hits"]) == (1, 1, 2)
    folder = Path(info["path"]).parents[2]  # <folder>/<entry>/forward/compiled_module
    assert folder.name.startswith("npugraph_ex_bench_cache_") and folder.is_dir()
    del cached
    gc.collect()
    assert not folder.exists()


def generation(tokens: list[int], logits: list[list[float]]) -> Generation:
    return Generation(tokens, [torch.tensor(row) for row in logits])


def test_identical_runs_agree_fully() -> None:
    run = generation([1, 0], [[0.0, 1.0], [1.0, 0.0]])
    found = agreement(run, run)
    assert found.all_agree
    assert (found.agree, found.checked, found.max_abs_logit_diff) == (2, 2, 0.0)


def test_logits_count_only_while_the_inputs_were_the_same() -> None:
    eager = generation([1, 1, 0], [[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    # Step 1 picks differently (so step 2 is fed another token): its logits are far apart.
    other = generation([1, 0, 0], [[0.0, 1.25], [1.0, 0.5], [100.0, 0.0]])
    found = agreement(eager, other)
    assert not found.all_agree
    assert (found.agree, found.checked) == (2, 3)
    assert found.max_abs_logit_diff == 1.0


class NextToken(torch.nn.Module):
    """A stand-in causal LM whose greedy pick is always the last token plus one."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.calls: list[int] = []

    def forward(self, input_ids: torch.Tensor, use_cache: bool) -> SimpleNamespace:
        assert use_cache is False
        self.calls.append(input_ids.shape[1])
        logits = torch.nn.functional.one_hot((input_ids + 1) % self.vocab, self.vocab).float()
        return SimpleNamespace(logits=logits)


def test_the_growing_workload_feeds_the_whole_sequence_every_step() -> None:
    model = NextToken(vocab=10)
    workload = Growing(model, torch.tensor([[3, 4]]), new_tokens=3, sync=lambda: None)
    assert list(workload.lengths) == [2, 3, 4]
    assert workload.npugraph_options() == {"capture_limit": 3}
    run = workload.bind(workload.step())
    ticks: list[int] = []
    seconds, found = run.first(lambda: ticks.append(1))
    assert found.tokens == [5, 6, 7]
    assert len(found.logits) == 3 and found.logits[0].shape == (10,)
    assert seconds > 0 and len(ticks) == 3
    assert run.block() > 0
    assert model.calls == [2, 3, 4, 2, 3, 4]


@pytest.mark.parametrize(("workload_type", "width"), [(OneToken, 1), (Window, 3)])
def test_the_fixed_length_workloads_slide_their_window_by_the_pick(
    workload_type: type, width: int
) -> None:
    model = NextToken(vocab=10)
    workload = workload_type(model, torch.tensor([[3, 4, 5][-width:]]), 3, lambda: None)
    run = workload.bind(workload.step())
    found = run.first(lambda: None)[1]
    # Each pick is the last token plus one: the window slid, never grew.
    assert found.tokens == [6, 7, 8]
    assert model.calls == [width] * 3
    assert workload.describe()["tokens_per_step"] == width


def test_the_decode_step_hands_over_the_cache_under_the_name_transformers_asks_for() -> None:
    pytest.importorskip("transformers")
    from models import make_tiny_qwen3

    decode = Decode(make_tiny_qwen3(), steps=2, max_cache_len=8, device="cpu", sync=lambda: None)
    cache = decode.new_cache()
    with warnings.catch_warnings(), torch.no_grad():
        # transformers 5.24 deprecates ``past_key_values`` with a FutureWarning.
        warnings.simplefilter("error", FutureWarning)
        decode.step()(torch.tensor([[1]]), torch.tensor([0]), cache)
    # The step wrote the caller's cache in place: one token, at position 0.
    assert int(cache.layers[0].cumulative_length) == 1
    assert cache.layers[0].keys[:, :, 0].abs().sum() > 0
    assert not cache.layers[0].keys[:, :, 1:].any()


def test_interleaving_runs_every_block_once_per_round_each_round_from_the_next() -> None:
    order: list[str] = []
    rounds: list[int] = []

    def block(name: str):  # noqa: ANN202
        return lambda: order.append(name) or 1.0

    times = interleaved(
        {"a": block("a"), "b": block("b")}, 2, warmup=1, after_round=lambda: rounds.append(1)
    )
    assert order == ["a", "b"] + ["a", "b"] + ["b", "a"]  # warm-up, then rotated rounds
    assert times == {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    assert len(rounds) == 3


@torch.no_grad()
def test_capture_summaries_count_the_keys_of_one_compiled_function() -> None:
    other = torch.compile(lambda x: x - 1, backend="npugraph_ex", dynamic=True)
    other(torch.ones(3))
    before = live_graph_numbers()
    fn = torch.compile(lambda x: x * 2, backend="npugraph_ex", dynamic=True)
    for n in (2, 3, 4):
        fn(torch.ones(n))
    summary = summarise(managers_since(before))
    assert (summary.graphs, summary.keys) == (1, 3)
    assert summary.pool_bytes > 0


def test_memory_is_read_from_the_process() -> None:
    assert resident_bytes() > 0
    meter = MemoryMeter("cpu")
    meter.start()
    kept = torch.ones(8 * 2**20, dtype=torch.uint8)
    kept.add_(1)
    assert meter.stop() >= 0


def test_a_record_starts_with_the_same_five_fields(tmp_path: Path) -> None:
    record = run_record("bench", {"repeats": 5}, command=["npugraph-ex", "bench"], env={"a": 1})
    assert list(record) == ["benchmark", "command", "timestamp", "environment", "settings"]
    record["workloads"] = {"decode": {"path": Path("x")}}
    path = write_json(tmp_path / "deep" / "bench.json", record)
    assert json.loads(path.read_text())["workloads"] == {"decode": {"path": "x"}}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_says_where_it_runs(name: str) -> None:
    assert set(VARIANTS[name].devices) <= {"cpu", "cuda"}


class Fixed:
    """The least a workload needs for the report: a name, block size and descriptions."""

    name = "decode"
    dynamic = False
    block_tokens = 4
    first_label = "first call"
    title = "decode: a fixed step"

    def describe(self) -> dict:
        return {"steps_per_block": 4}


def test_a_failed_variant_keeps_its_row_and_its_error() -> None:
    from npugraph_ex.bench.output import table
    from npugraph_ex.bench.runner import FIELDS, VariantResult, WorkloadResult

    tokens = Generation([1, 2], [torch.zeros(3), torch.zeros(3)])
    eager = VariantResult(VARIANTS["eager"], 0.01, 0, tokens, [0.2, 0.4, 0.3])
    fast = VariantResult(VARIANTS["npugraph_ex"], 2.0, 2**20, tokens, [0.1, 0.1, 0.2])
    fast.agreement = agreement(tokens, tokens)
    args = {"eager": None, "npugraph_ex": {"backend": "npugraph_ex"}, "inductor": {}}
    result = WorkloadResult(
        Fixed(), {"eager": eager, "npugraph_ex": fast}, {"inductor": "RuntimeError: no"}, args
    )
    record = result.record()
    assert list(record["variants"]) == ["eager", "npugraph_ex", "inductor"]
    assert record["variants"]["npugraph_ex"]["speedup_vs_eager"] == 3.0
    assert record["variants"]["npugraph_ex"]["tokens_per_s"] == 40.0
    assert record["variants"]["inductor"] == {**dict.fromkeys(FIELDS), "error": "RuntimeError: no"}
    lines = table(result, "cpu").splitlines()
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[:5]]
    assert cells[0][:3] == ["variant", "first call s", "tokens/s"]
    assert cells[3][0] == "npugraph_ex"
    assert cells[3][3] == "3.00x" and cells[3][8] == "yes"
    assert cells[4][:3] == ["inductor", "failed", "-"]
    assert lines[5] == "inductor failed: RuntimeError: no"
