"""How the CPU replay engine re-issues one recorded kernel.

At capture every ATen kernel call is turned into a *step*: a callable with its arguments bound to
the exact tensors the call used. Replaying the steps in order recomputes every output into the
tensor object it was first produced in, so addresses never change:

    captured:  %add = aten.add.Tensor(%x, %y)         -> a fresh tensor T
    replayed:  aten.add.out(x, y, out=T)               (writes T in place)

Rules, per kernel:

- views and other outputs that share storage with an input are not recomputed: they alias memory
  that is itself fixed, so they stay valid;
- in-place and ``out=`` kernels are re-issued as recorded;
- a functional kernel with an ``out=`` overload is re-issued through it, into its recorded output
  (Python numbers it takes as tensors are wrapped once, at capture, where that is exact), once a
  trial has shown that the overload writes such an output in place (``out_check``); a random
  op has no trial (it would draw numbers), so it computes and copies as below, drawing from the
  generator eager draws from, in the graph's order;
- any other functional kernel computes a temporary and copies it into its recorded output;
- copies (``clone``, ``_to_copy``) become one ``copy_`` into their recorded output;
- scope markers (``npugraph_ex.scope``) become a call of their effect, which is on the host;
- ``empty``-like factories and kernels without tensor outputs (metadata checks) are dropped;
- control flow (``torch.cond``, ``while_loop``) and the other higher-order ops of
  ``schemas.CONTROL_FLOW`` (none writing its operands: ``analysis`` refuses those) are
  re-issued whole on every replay, as eager runs them: a predicate is read then, a branch's
  kernels run eagerly, and the results are copied into the recorded outputs (the kernels
  around them replay as usual);
- a functional collective (``_c10d_functional.all_reduce``, what Dynamo makes of
  ``dist.all_reduce``) returns before its result is complete: it is waited for before the copy
  (its own ``wait_tensor`` step, on the recorded output, has no work left to wait for).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload
from torch.utils import _pytree as pytree

from npugraph_ex.errors import CaptureError
from npugraph_ex.runtime.cpu.memory import storage_key, storage_keys
from npugraph_ex.runtime.cpu.out_check import writes_in_place
from npugraph_ex.runtime.tensors import tensors_in
from npugraph_ex.schemas import CONTROL_FLOW, TENSOR_OPTION_ARGS, is_collective, out_variant
from npugraph_ex.scope.ops import host_effect, is_scope_marker

aten = torch.ops.aten

UNINITIALISED_FACTORIES = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)

COPIES_OF_FIRST_ARGUMENT = frozenset(
    {
        aten.clone.default,
        aten._to_copy.default,
        aten.lift_fresh_copy.default,
        torch.ops.prims.convert_element_type.default,
    }
)
"""Kernels whose result is a copy of their input (perhaps in another dtype): replayed as one
``copy_`` into the recorded result, because their ``out=`` overloads allocate a temporary (and
``prims.convert_element_type``, which graphs with dynamic shapes carry, has none: it is
``empty_like`` then ``copy_``)."""

SYNCHRONOUS_NAMESPACES = frozenset({"aten", "prims"})
"""Ops known to be done with their arguments when they return, with effects their schemas tell.
Any other op (a collective, which reads its input until its ``wait_tensor``; a custom op) may
keep reading or writing them: a capture never frees what such an op was given, and no step of
it is constant (``constants``)."""

EXACT_NUMBER_DTYPES = frozenset({torch.float32, torch.float64})
"""Dtypes that CPU kernels compute in as they are, a Python number operand included."""

Step = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""A bound kernel call: ``fn(*args, **kwargs)``; ``fn`` is the OpOverload for in-place and
``out=`` steps (``bindings`` swaps in the fastest way to call it)."""

PlannedStep = tuple[str, Step]
"""A step and its kind: ``"inplace"`` or ``"effect"`` (re-issued as recorded), ``"host"`` (a
scope's effect), ``"out"`` or ``"copy"``."""


def numbers_for_tensors(op: OpOverload, args: tuple, kwargs: dict) -> frozenset[str]:
    """Names of Tensor arguments the call passes Python numbers for."""
    names = []
    for position, argument in enumerate(op._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        if str(argument.type) == "Tensor" and isinstance(value, (bool, int, float)):
            names.append(argument.name)
    return frozenset(names)


def prewrap_numbers(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> tuple[tuple, dict]:
    """Replace Python numbers passed for Tensor arguments by 0-d tensors made once.

    A number is wrapped and converted to the computation dtype inside every call (an allocation
    and a copy). Where every tensor operand and the result share one of ``EXACT_NUMBER_DTYPES``,
    that dtype is the computation dtype whatever the number is, so a 0-d tensor of it gives the
    same bits. Reduced-precision floats compute with the number in float32 (``x * 100000.0`` on
    float16 is finite while 100000 is not a float16), so their numbers stay numbers.
    """
    numbers = numbers_for_tensors(op, args, kwargs)
    operands = tensors_in((args, kwargs))
    if not numbers or not isinstance(result, torch.Tensor) or not operands:
        return args, kwargs
    dtype = result.dtype
    if dtype not in EXACT_NUMBER_DTYPES or any(t.dtype != dtype for t in operands):
        return args, kwargs
    wrapped_args = list(args)
    wrapped_kwargs = dict(kwargs)
    for position, argument in enumerate(op._schema.arguments):
        if argument.name not in numbers:
            continue
        if position < len(args):
            wrapped_args[position] = torch.tensor(args[position], dtype=dtype)
        else:
            wrapped_kwargs[argument.name] = torch.tensor(kwargs[argument.name], dtype=dtype)
    return tuple(wrapped_args), wrapped_kwargs


def needs_recompute(output: torch.Tensor, input_storages: set[int]) -> bool:
    """False for outputs that alias an input (fixed already) or hold no elements;
    ``input_storages``: the inputs' ``storage_keys``."""
    if output.numel() == 0:
        return False
    return storage_key(output) not in input_storages


def result_structure(op: OpOverload, result: Any) -> list[Any]:
    """One entry per schema return (a tensor, a list of tensors, or a non-tensor)."""
    return [result] if len(op._schema.returns) == 1 else list(result)


def plan_step(op: OpOverload, args: tuple, kwargs: dict, result: Any) -> PlannedStep | None:
    """The step that recomputes ``result`` in place on replay, or None when nothing must run."""
    if op in UNINITIALISED_FACTORIES:
        return None
    if op in CONTROL_FLOW:
        fresh = list(range(len(tensors_in(result))))
        return "copy", compute_and_copy(op, args, kwargs, result, fresh)
    if is_scope_marker(op):
        return "host", (host_effect(op), args, kwargs)
    leaves = pytree.tree_leaves(result)
    if any(not isinstance(leaf, torch.Tensor) for leaf in leaves if leaf is not None):
        if torch.Tag.data_dependent_output in op.tags:
            raise CaptureError(f"{op} reads tensor data on the host")
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    input_storages = storage_keys((args, kwargs))
    fresh = [i for i, t in enumerate(tensors) if needs_recompute(t, input_storages)]
    if op._schema.is_mutable:
        if not fresh:
            return "inplace", (op, args, kwargs)
        return "copy", compute_and_copy(op, args, kwargs, result, fresh)
    if not fresh:
        return None
    if op in COPIES_OF_FIRST_ARGUMENT:
        return "out", (aten.copy_.default, (result, args[0]), {})
    args, kwargs = prewrap_numbers(op, args, kwargs, result)
    variant = out_variant(op, numbers_for_tensors(op, args, kwargs))
    # A random op's trial would draw numbers eager does not, and could not compare them.
    random = torch.Tag.nondeterministic_seeded in op.tags
    if variant is not None and len(fresh) == len(tensors) and not random:
        out_op, out_names = variant
        out_kwargs = {k: v for k, v in kwargs.items() if k not in TENSOR_OPTION_ARGS}
        results = result_structure(op, result)
        if writes_in_place(out_op, args, out_kwargs, out_names, results):
            out_kwargs.update(zip(out_names, results, strict=True))
            return "out", (out_op, args, out_kwargs)
    return "copy", compute_and_copy(op, args, kwargs, result, fresh)


def one_tensor(new: torch.Tensor) -> tuple[torch.Tensor]:
    return (new,)


def tensors_as_returned(new: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    return new


def result_tensor_lister(result: Any) -> Callable[[Any], Sequence[torch.Tensor]]:
    """How to list a kernel's tensor results on replay, chosen from what it returned at capture
    (the same kernel on the same arguments returns the same structure): the common shapes, one
    tensor or a tuple of tensors, without walking the structure on every call."""
    if isinstance(result, torch.Tensor):
        return one_tensor
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return tensors_as_returned
    return tensors_in


def compute_and_copy(
    op: OpOverload | HigherOrderOperator, args: tuple, kwargs: dict, result: Any, fresh: list[int]
) -> Step:
    """A step that runs ``op`` functionally and copies its fresh outputs into the recorded ones.

    The recorded outputs travel as the step's first argument, so that every tensor a step
    touches is in its arguments (memory planning re-points them there).
    """
    indices = tuple(fresh)
    listed = result_tensor_lister(result)
    tensors = listed(result)
    targets = tuple(tensors[i] for i in fresh)
    if is_collective(op):
        return CollectiveCopy(op, indices, listed), (targets, *args), kwargs
    return copying_kernel(op, indices, listed), (targets, *args), kwargs


COMPUTED_BY: dict[Callable[..., None], OpOverload] = {}
"""The op each compute-and-copy function computes (what ``constants`` reads its effects from);
as many as ``copying_kernel`` made, which keeps them for the process's life anyway."""


@functools.cache
def copying_kernel(
    op: OpOverload | HigherOrderOperator,
    indices: tuple[int, ...],
    listed: Callable[[Any], Sequence[torch.Tensor]],
) -> Callable[..., None]:
    """The function of a compute-and-copy step: it holds no tensor, so one serves every step and
    every capture that runs ``op`` and copies the same results (a key keeps no closure of its
    own)."""
    kernel = op._op if isinstance(op, OpOverload) else op

    def run(targets: tuple[torch.Tensor, ...], *call_args: Any, **call_kwargs: Any) -> None:
        new = listed(kernel(*call_args, **call_kwargs))
        for index, target in zip(indices, targets, strict=True):
            target.copy_(new[index])

    run.__qualname__ = f"compute_and_copy[{op}]"
    COMPUTED_BY[run] = op
    return run


class CollectiveCopy:
    """A functional collective, replayed: issue it, wait for its result, copy that into the
    recorded output. ``issue`` and ``finish`` are the two halves, for a stream block that
    issues its collectives in place and waits for them at its join (``lanes``)."""

    wait = torch.ops._c10d_functional.wait_tensor.default

    def __init__(self, op: OpOverload, indices: tuple[int, ...], listed: Callable) -> None:
        self.kernel = op._op
        self.indices = indices
        self.listed = listed
        self.__qualname__ = f"compute_and_copy[{op}]"

    def __call__(self, targets: tuple[torch.Tensor, ...], *args: Any, **kwargs: Any) -> None:
        self.finish(targets, self.issue(targets, *args, **kwargs))

    def issue(self, targets: tuple[torch.Tensor, ...], *args: Any, **kwargs: Any) -> Sequence:
        return self.listed(self.kernel(*args, **kwargs))

    def finish(self, targets: tuple[torch.Tensor, ...], new: Sequence[torch.Tensor]) -> None:
        for index, target in zip(self.indices, targets, strict=True):
            self.wait(new[index])
            target.copy_(new[index])
