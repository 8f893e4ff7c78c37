"""``npugraph_ex.tools.bisect`` and ``npugraph-ex bisect``: the layer, the pass and the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import npugraph_ex
import npugraph_ex.tools
from npugraph_ex.cli import main as cli_main
from npugraph_ex.runtime.cpu import build as cpu_build
from npugraph_ex.tools.bisection import bisect

pytestmark = pytest.mark.usefixtures("scratch_registry")


def sinh_plus_cosh(x: torch.Tensor) -> torch.Tensor:
    return torch.sinh(x) + torch.cosh(x)


def exp_slightly_off(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) * 1.001


def model(x: torch.Tensor) -> torch.Tensor:
    return (sinh_plus_cosh(x * 3).relu() + 1).sum(-1)


def trial_names(result: Any) -> list[str]:
    return [t.name for t in result.trials]


def test_the_debug_package_names_where_bisect_went() -> None:
    with pytest.raises(AttributeError, match=r"from npugraph_ex.tools import bisect"):
        npugraph_ex.debug.bisect  # noqa: B018


def test_a_correct_function_passes_every_trial() -> None:
    result = npugraph_ex.tools.bisect(model, torch.randn(4, 8), static_kernels=False)
    assert result.layer is None and result.node is None
    assert trial_names(result) == [
        "aot_eager (Dynamo + AOTAutograd)",
        "npugraph_ex, force_eager, every pass off",
        "npugraph_ex, force_eager",
        "npugraph_ex (capture, then replay)",
    ]
    assert all(t.ok for t in result.trials)
    assert result.report().endswith("every layer matches eager")


def test_a_subtly_wrong_user_pattern_is_named_with_its_pass_and_node() -> None:
    npugraph_ex.register_replacement(sinh_plus_cosh, exp_slightly_off, [torch.randn(4)])
    result = bisect(model, torch.randn(4, 8), static_kernels=False)
    assert result.layer == "pass pattern_fusion_pass"
    assert [(t.name, t.ok) for t in result.trials][2:] == [
        ("npugraph_ex, force_eager", False),
        ("npugraph_ex, force_eager, native_streams off", False),
        ("npugraph_ex, force_eager, remove_noop_ops off", False),
        ("npugraph_ex, force_eager, pattern_fusion_pass off", True),
    ]
    node = result.node
    assert node.origin == "add" and "torch.sinh(x) + torch.cosh(x)" in node.source
    assert node.max_abs > 0
    report = result.report()
    assert "first layer that changes the result: pass pattern_fusion_pass" in report
    assert f"first node that differs: {node.name} ({node.op}) in graph[0/0]" in report


def test_a_replay_fault_is_named_capture_replay_with_its_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay engine whose relu step writes one too much: only replays are wrong."""
    real = cpu_build.fastest_call

    def faulty(fn: Any, args: Any, kwargs: Any) -> Any:
        call = real(fn, args, kwargs)
        if fn is not torch.ops.aten.relu_.default:
            return call

        def relu_then_fault(*a: Any, **k: Any) -> Any:
            out = call(*a, **k)
            return out.add_(1.0)

        return relu_then_fault

    monkeypatch.setattr(cpu_build, "fastest_call", faulty)
    result = bisect(model, torch.randn(4, 8), static_kernels=False)
    assert result.layer == "capture/replay"
    assert trial_names(result)[-1] == "npugraph_ex (capture, then replay)"
    assert result.node.op == "aten.relu_.default" and result.node.origin == "relu"
    assert result.node.max_abs == pytest.approx(1.0, rel=1e-3)


REPRO = """
import torch
import npugraph_ex


def sinh_plus_cosh(x):
    return torch.sinh(x) + torch.cosh(x)


def make():
    npugraph_ex.register_replacement(
        sinh_plus_cosh, lambda x: torch.exp(x) * 1.001, [torch.randn(4)], skip_duplicates=True
    )
    return (lambda x: sinh_plus_cosh(x * 3).relu()), (torch.randn(4, 8),)
"""


def test_the_command_names_the_layer_and_exits_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "repro.py").write_text(REPRO)
    status = cli_main(["bisect", f"{tmp_path / 'repro.py'}:make", "--no-static-kernels"])
    out = capsys.readouterr().out
    assert status == 1
    assert "first layer that changes the result: pass pattern_fusion_pass" in out
    assert "first divergence" in out  # the comparer's report follows


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing.py:make", "missing.py: no such file"),
        ("repro.py", "'repro.py': write the target as FILE.py:FUNCTION"),
        ("repro.py:nothing", "repro.py has no function 'nothing'"),
    ],
)
def test_a_bad_target_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
    target: str, message: str,
) -> None:  # fmt: skip
    (tmp_path / "repro.py").write_text(REPRO)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["bisect", target]) == 2
    assert capsys.readouterr().err.strip() == f"npugraph-ex bisect: {message}"
