"""Every replay computes this call's values: no kernel is skipped, no number is rounded early."""

from __future__ import annotations

import pytest
import torch

from helpers import totals


def compiled(fn, **kwargs):
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, **kwargs)


@pytest.mark.parametrize(
    "fn", [lambda x: x << 2, lambda x: x >> 1, lambda x: x & 6, lambda x: x ^ 3, lambda x: x | 8]
)
def test_bitwise_and_shift_operators_recompute_on_every_replay(fn) -> None:
    opt = compiled(fn)
    for value in (1, 5, 7, 12):
        x = torch.tensor([value, value + 1])
        assert torch.equal(opt(x), fn(x))
    assert totals()["replays"] == 3


def test_an_int_shift_amount_that_changes_is_applied_on_every_call() -> None:
    opt = compiled(lambda x, s: x << s, dynamic=True)
    for value, shift in [(1, 2), (5, 2), (7, 3), (7, 1), (3, 2)]:
        x = torch.tensor([value, value + 1])
        assert torch.equal(opt(x, shift), x << shift)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("number", [100000.0, 0.1, 1e-5])
def test_reduced_precision_floats_keep_a_python_number_at_full_precision(dtype, number) -> None:
    # Eagerly, x * 100000.0 on float16 computes in float32 (100.06 for x = 0.001); a number
    # rounded to float16 first is inf.
    opt = compiled(lambda x: x * number + number)
    for seed in range(3):
        x = torch.randn(512, generator=torch.Generator().manual_seed(seed)).to(dtype) / 1000
        assert torch.equal(opt(x), x * number + number)
    assert totals()["replays"] == 2


def well_conditioned(seed: int) -> torch.Tensor:
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))
    return a @ a.mT + 4 * torch.eye(4)


@pytest.mark.parametrize(
    "fn",
    [
        torch.linalg.inv,
        lambda a: torch.linalg.solve(a, a[:, :2]),
        torch.linalg.cholesky,
        lambda a: torch.linalg.lu_factor(a)[0],
    ],
    ids=["inv", "solve", "cholesky", "lu_factor"],
)
def test_linalg_ops_with_error_checks_replay(fn) -> None:
    opt = torch.compile(fn, backend="npugraph_ex")
    for seed in range(3):
        a = well_conditioned(seed)
        assert torch.equal(opt(a), fn(a))
    assert totals()["replays"] == 2


def test_a_replayed_error_check_still_raises_for_a_singular_matrix() -> None:
    plain = torch.compile(torch.linalg.inv, backend="aot_eager")
    plain(well_conditioned(0))
    try:
        plain(torch.zeros(4, 4))
        pytest.skip(f"torch {torch.__version__}'s AOTAutograd drops the check, any backend")
    except torch.linalg.LinAlgError:
        torch._dynamo.reset()
    opt = torch.compile(torch.linalg.inv, backend="npugraph_ex")
    opt(well_conditioned(0))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        opt(torch.zeros(4, 4))
    assert torch.equal(opt(well_conditioned(1)), torch.linalg.inv(well_conditioned(1)))
    assert totals()["replays"] == 1  # the replay that raised is not counted
