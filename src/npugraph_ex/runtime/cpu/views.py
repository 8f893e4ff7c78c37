"""One tensor object per view: what a capture keeps of the tensors its steps pass.

A capture records every tensor its kernels were given, each its own Python object (a few hundred
bytes of C++ and Python each). Many of them are the same memory with the same geometry:

- intermediates placed in the pool's arena at the same offset with the same shape (each layer's
  MLP output, say), which share bytes at different times;
- views of storages that never move (parameters, constants, inputs used in place), made anew by
  every capture: each key of a graph held its own transposed view of every weight.

To every kernel two such objects are one and the same argument, so a capture binds one object
per place: per arena offset, sizes, strides and dtype within a capture, and per storage and
geometry across all captures of the process for storages that never move (``fixed_views``).
A view of the arena a kernel made is bound as a tensor of its own over the same place (its
``detach``): as a view it kept its base alive, and autograd's record of it. On the tiny Qwen3
forward a key's steps pass 117 objects instead of 312, of which 48 views of the weights are the
same for every key.

What moves is left alone: output storages, whose views are re-pointed one by one at a key switch
(``pool``). The arena's views are not re-pointed after placement (growing the arena resizes
its one storage), and nothing re-points a storage that never moves.
"""

from __future__ import annotations

from typing import Any

import torch

from npugraph_ex.fixed_views import geometry, shared_view
from npugraph_ex.runtime.cpu.memory import storage_key
from npugraph_ex.runtime.cpu.program import StraightLine, map_arguments


def share_equal_views(replay: StraightLine, arena: torch.UntypedStorage, moving: set[int]) -> None:
    """Bind one tensor object wherever the steps of ``replay`` pass views of one place (see the
    module docstring); ``moving`` holds the :func:`storage_key` of the storages whose views are
    re-pointed one by one."""
    in_arena: dict[tuple, torch.Tensor] = {}

    def one_of(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(one_of(v) for v in value)
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            return value
        key = storage_key(value)
        if key in moving:
            return value
        if key == arena._cdata:
            place = geometry(value)
            if place not in in_arena:
                in_arena[place] = without_base(value)
            return in_arena[place]
        return shared_view(value)

    map_arguments(replay, one_of)


def without_base(view: torch.Tensor) -> torch.Tensor:
    """The same place as a tensor of its own (``detach``, as ``caller_aliases`` makes them): a
    view a kernel made keeps its base alive and autograd's record of it (about 300 bytes of
    C++), which no replay reads."""
    if view._base is None or view.requires_grad:
        return view
    return view.detach()
