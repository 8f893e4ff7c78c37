"""``static_kernel_compile``: Inductor kernels per captured key, cached across processes.

Inductor compiles slowly on small machines, so the compiling tests are few: one model, run in
fresh processes sharing one Inductor cache directory.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx

from helpers import graphs_called
from npugraph_ex.config import Config
from npugraph_ex.passes.manager import PassManager
from npugraph_ex.passes.pipeline import PIPELINE

RUN = Path(__file__).with_name("kernel_cache_run.py")
ATOL = 1e-5
"""Inductor's fused C++ loops sum in another order than ATen's kernels."""

CAPTURE_ONLY_PASSES = {
    "native_streams",
    "remove_cat_ops",
    "inplace_pass",
    "input_inplace_pass",
    "plan_streams",
}


def start_fresh(cache_dir: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    return subprocess.Popen(
        [sys.executable, str(RUN), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def report_of(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def three_processes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """First compile, second process on the same cache, third with the cache disabled and
    kernels for 5 rows only (its own cache folder, so it runs beside the first)."""
    cache_dir = tmp_path_factory.mktemp("inductor-cache")
    first = start_fresh(cache_dir)
    third = start_fresh(
        tmp_path_factory.mktemp("inductor-cache-off"), "--disable-cache", "--rows-with-kernels", "5"
    )
    first_report = report_of(first)
    second_report = report_of(start_fresh(cache_dir))
    return [first_report, second_report, report_of(third)]


@pytest.mark.slow
def test_each_key_gets_kernels_equal_to_eager(three_processes: list[dict[str, Any]]) -> None:
    first = three_processes[0]
    # Shapes 3, 5, 3: two keys, each compiled once; the third call replays the first key.
    assert first["static_kernels"] == {"compiled": 2}
    assert (first["captures"], first["replays"], first["eager_calls"]) == (2, 1, {})
    assert first["max_output_diff"] <= ATOL
    # The buffer the model adds into is written by the kernels, once per call.
    assert first["buffer_diff"] <= ATOL


@pytest.mark.slow
def test_a_second_process_loads_the_kernels_from_the_cache(
    three_processes: list[dict[str, Any]],
) -> None:
    second = three_processes[1]
    assert second["static_kernels"] == {"cache_hit": 2}
    assert second["max_output_diff"] <= ATOL
    assert second["buffer_diff"] <= ATOL


@pytest.mark.slow
def test_disabling_the_cache_compiles_again_and_sym_values_choose_the_keys(
    three_processes: list[dict[str, Any]],
) -> None:
    third = three_processes[2]
    # Rows 3, 5, 3 with kernels for 5 rows only: the 3-row key captures the ATen graph.
    assert third["static_kernels"] == {"not chosen": 1, "compiled": 1}
    assert (third["captures"], third["replays"]) == (2, 1)
    assert third["max_output_diff"] <= ATOL


def test_capture_only_passes_make_way_for_inductor() -> None:
    plain = {p.name for p in PassManager(PIPELINE, Config()).selected()}
    lowered = {p.name for p in PassManager(PIPELINE, Config(static_kernel_compile=True)).selected()}
    assert CAPTURE_ONLY_PASSES <= plain
    assert plain - lowered == CAPTURE_ONLY_PASSES


@torch.library.custom_op("npugraph_ex_tests::double_without_fake", mutates_args=())
def double_without_fake(x: torch.Tensor) -> torch.Tensor:
    """A custom op with no fake implementation: it runs, but cannot be traced for Inductor."""
    return x * 2


def insert_custom_op(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Route the graph's first output through ``double_without_fake``."""
    output = gm.graph.output_node()
    first = output.args[0][0]
    with gm.graph.inserting_before(output):
        routed = gm.graph.call_function(torch.ops.npugraph_ex_tests.double_without_fake, (first,))
    output.args = ((routed, *output.args[0][1:]),)
    gm.recompile()


def test_a_key_whose_kernels_fail_captures_the_aten_graph(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = torch.nn.Linear(8, 8)
    options = {"static_kernel_compile": True, "post_grad_custom_post_pass": insert_custom_op}
    compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True, options=options)
    x = torch.randn(2, 8)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="npugraph_ex"):
        first, second = compiled(x), compiled(x)
        expected = model(x) * 2
    assert torch.equal(first, expected) and torch.equal(second, expected)
    [graph] = graphs_called()
    assert graph["static_kernels"] == {"failed": 1}
    assert (graph["captures"], graph["replays"]) == (1, 1)
    [record] = [r for r in caplog.records if "static_kernel_compile failed" in r.getMessage()]
    assert "this key captures the ATen graph instead" in record.getMessage()


def accumulate(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    total.add_(torch.relu(x))
    return total * 2


@pytest.mark.slow
def test_a_recapture_reuses_the_kernels_of_its_shapes() -> None:
    compiled = torch.compile(
        accumulate, backend="npugraph_ex", fullgraph=True, options={"static_kernel_compile": True}
    )
    x = torch.randn(4, 8)
    first, second = torch.zeros(4, 8), torch.zeros(4, 8)
    with torch.no_grad():
        compiled(x, first)
        compiled(x, first)
        # Another buffer to write: the key is captured again, for the same shapes.
        out = compiled(x, second)
    expected = torch.relu(x)
    torch.testing.assert_close(first, 2 * expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(second, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(out, 2 * expected, atol=ATOL, rtol=0)
    [graph] = graphs_called()
    assert graph["recaptures"] == {"mutated input moved": 1}
    made = graph["static_kernels"]
    assert made["reused"] == 1 and made.get("compiled", 0) + made.get("cache_hit", 0) == 1


def scaled_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


@torch.no_grad()
def test_inputs_a_copy_cannot_lay_out_as_called_reach_the_kernels_copied() -> None:
    # The key's buffer of an expanded input (stride 0), or of one sliced with steps, is dense:
    # the kernels compiled for the buffers refused the caller's own tensors from the second
    # call on ("expected size 4==4, stride 0==3 at dim=0").
    compiled = torch.compile(
        scaled_sum, backend="npugraph_ex", fullgraph=True, options={"static_kernel_compile": True}
    )
    for _ in range(3):
        x, y = torch.randn(1, 3).expand(4, 3), torch.randn(8, 9)[::2, ::3]
        torch.testing.assert_close(compiled(x, y), scaled_sum(x, y), atol=ATOL, rtol=0)
    [graph] = graphs_called()
    assert (graph["captures"], graph["replays"]) == (1, 2)
