"""Replay calls a PyTorch binding only when it reaches the recorded kernel."""

from __future__ import annotations

import torch

from npugraph_ex.runtime.cpu.bindings import fastest_call

aten = torch.ops.aten


def test_binding_that_reaches_the_kernel_is_used() -> None:
    a, b, out = torch.randn(2, 3), torch.randn(3, 4), torch.empty(2, 4)
    call = fastest_call(aten.mm.out, (a, b), {"out": out})
    assert call is torch._C._VariableFunctions.mm
    call(a, b, out=out)
    assert torch.equal(out, a @ b)


def test_in_place_kernels_use_the_tensor_method() -> None:
    cache = torch.zeros(3, 2)
    args = (cache, 0, torch.tensor([1]), torch.ones(1, 2))
    call = fastest_call(aten.index_copy_.default, args, {})
    assert call is torch._C.TensorBase.index_copy_
    call(*args)
    assert cache[1].tolist() == [1.0, 1.0]


def test_binding_reaching_another_overload_is_not_used() -> None:
    # torch.add(x, 1, out=o) reaches add.out (allocating a wrapped scalar), not add.Scalar_out.
    x, out = torch.randn(3), torch.empty(3)
    call = fastest_call(aten.add.Scalar_out, (x, 1), {"out": out})
    assert call is aten.add.Scalar_out._op
    call(x, 1, out=out)
    assert torch.equal(out, x + 1)


def test_probing_a_binding_runs_nothing() -> None:
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    out = torch.zeros(2, 2)
    fastest_call(aten.sub.out, (a, b), {"out": out})
    assert torch.equal(out, torch.zeros(2, 2))


def test_binding_that_returns_without_writing_is_not_used() -> None:
    # Tensor.__lshift__(x, 2, out=o) returns NotImplemented and writes nothing.
    x, out = torch.tensor([1, 5, 7]), torch.zeros(3, dtype=torch.long)
    call = fastest_call(aten.__lshift__.Scalar_out, (x, 2), {"out": out})
    assert call is not torch._C.TensorBase.__lshift__
    call(x, 2, out=out)
    assert out.tolist() == [4, 20, 28]


def test_binding_that_passes_another_default_is_not_used() -> None:
    # torch._C._nn.mse_loss(x, y, out=o) passes reduction=none; the recorded call left the
    # schema's default, mean.
    x, y, out = torch.rand(5, 5), torch.rand(5, 5), torch.empty(())
    call = fastest_call(aten.mse_loss.out, (x, y), {"out": out})
    assert call is not torch._C._nn.mse_loss
    call(x, y, out=out)
    assert torch.equal(out, torch.nn.functional.mse_loss(x, y))
