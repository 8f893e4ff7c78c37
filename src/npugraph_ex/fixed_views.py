"""One tensor object per view of memory that never moves: parameters, buffers, constants.

Every capture makes tensor objects over the model's weights: the alias of each parameter its
inputs are staged with, the transposed view of a weight each product passes. To every kernel
two such objects with the same storage and geometry are one and the same argument, and each
costs a few hundred bytes of C++ and Python, so all captures of the process share one object
per storage and geometry while any of them holds it (each key of a graph used to hold its own).
"""

from __future__ import annotations

import weakref

import torch

FIXED_VIEWS: weakref.WeakValueDictionary[tuple, torch.Tensor] = weakref.WeakValueDictionary()
"""By :func:`place`, the one object every capture binds there."""


def geometry(tensor: torch.Tensor) -> tuple:
    """Everything a kernel reads of a tensor besides its storage."""
    return (
        tensor.storage_offset(),
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.is_neg(),
        tensor.is_conj(),
    )


def place(tensor: torch.Tensor) -> tuple:
    """A strided tensor's storage (its identity, which outlives freed bytes) and geometry."""
    return (tensor.untyped_storage()._cdata, *geometry(tensor))


def shared_view(tensor: torch.Tensor) -> torch.Tensor:
    """The object bound at ``tensor``'s place, ``tensor`` itself if it is the first."""
    return FIXED_VIEWS.setdefault(place(tensor), tensor)


def alias_of(tensor: torch.Tensor) -> torch.Tensor:
    """A capture's own object over a parameter's or buffer's memory, so that the caller's tensor
    can die (it does not require grad), shared with every other capture of that memory."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.layout != torch.strided:
        return tensor.detach()
    key = place(tensor)
    alias = FIXED_VIEWS.get(key)
    if alias is None or alias.requires_grad:
        alias = FIXED_VIEWS[key] = tensor.detach()
    return alias
