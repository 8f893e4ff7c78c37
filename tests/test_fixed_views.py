"""One tensor object per view of memory that never moves, shared by every capture."""

from __future__ import annotations

import gc

import torch

from npugraph_ex.fixed_views import FIXED_VIEWS, alias_of, place, shared_view


def test_an_alias_is_one_object_per_storage_and_geometry() -> None:
    weight = torch.nn.Parameter(torch.randn(4, 6))
    alias = alias_of(weight)
    assert alias is alias_of(weight)
    assert alias is not weight and not alias.requires_grad
    assert alias.data_ptr() == weight.data_ptr()
    transposed = shared_view(alias.t())
    assert transposed is not alias and transposed is shared_view(alias.t())
    assert alias_of(weight[1:]) is not alias  # same storage, another place


def test_an_alias_is_forgotten_once_no_capture_holds_it() -> None:
    weight = torch.nn.Parameter(torch.randn(4, 6))
    alias = alias_of(weight)
    key = place(weight)
    assert FIXED_VIEWS[key] is alias
    del alias
    gc.collect()
    assert key not in FIXED_VIEWS
    assert alias_of(weight).data_ptr() == weight.data_ptr()


class Tagged(torch.Tensor):
    pass


def test_a_tensor_subclass_or_sparse_tensor_gets_an_alias_of_its_own() -> None:
    tagged = torch.randn(3).as_subclass(Tagged)
    sparse = torch.randn(3, 3).to_sparse()
    for tensor in (tagged, sparse):
        first, second = alias_of(tensor), alias_of(tensor)
        assert first is not second
        assert type(first) is type(tensor) and torch.equal(first.to_dense(), tensor.to_dense())
