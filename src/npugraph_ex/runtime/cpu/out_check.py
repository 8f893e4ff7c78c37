"""Whether an ``out=`` overload computes its functional twin's result into ``out``, as it stands.

Replay re-issues a functional kernel through its ``out=`` overload, into the tensor the capture
recorded. Most overloads write ``out`` in place; a few do not, and no schema says which:
``binary_cross_entropy.out`` given an ``out`` of the reduced shape computes another value, and
``soft_margin_loss.out`` resizes ``out`` to the input's shape before reducing (in the pool's arena
that would write past the output's bytes). So the first time an overload meets a layout of
arguments, it runs once on scratch outputs of the recorded results' exact layout, and is trusted
only if it keeps their shape, strides and storage and gives the same bits; otherwise the step
computes functionally and copies. The verdict is kept per overload and argument layout: a model's
repeated layers pay for the trial once.

A trial's scratch outputs are as large as the results, and alive with them: for a language
model's logits, a second copy at every new sequence length (for Qwen3-0.6B's vocabulary, 0.6 MiB
per token). So a result of ``LARGE_TRIAL_BYTES`` or more skips its trial where the overload was
trusted with the same *pattern* of layouts (ranks, dtypes, devices, which sizes are 0 or 1, the
order of the strides, every other argument's value; not the sizes) in every trial of that
pattern so far: the overloads that fail a trial fail it for a pattern (an ``out`` of the reduced
shape, one resized to the input's), not for one size of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree

from npugraph_ex.runtime.cpu.memory import aligned
from npugraph_ex.runtime.tensors import tensors_in

VERDICTS: dict[tuple, bool] = {}
"""Per (``out=`` overload, layout of its arguments and results): whether it writes in place.
The oldest verdicts go beyond ``VERDICT_LIMIT``: each new size of a dynamic graph adds its
layouts (about 28 for a small Qwen3 forward, some 0.4 KiB of Python objects each), while a
capture meets its repeated layers' layouts again within a few dozen; a verdict forgotten costs
one more trial."""

VERDICT_LIMIT = 256

PATTERN_VERDICTS: dict[tuple, bool] = {}
"""Per (``out=`` overload, pattern of its arguments' and results' layouts): whether every trial
of that pattern trusted it (kept, and capped, as ``VERDICTS`` are)."""

LARGE_TRIAL_BYTES = 1 << 20
"""Results of this many bytes or more skip a trial their pattern's verdict answers."""


def layout_of(value: Any) -> Any:
    """What the verdict depends on: tensors' layouts, every other argument's value."""
    return described(value, tensor_layout)


def pattern_of(value: Any) -> Any:
    """A layout without its sizes: what a trial's verdict is trusted for at another size."""
    return described(value, tensor_pattern)


def described(value: Any, tensor_form: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with every tensor in it as ``tensor_form`` gives it, every other value as its
    ``repr`` (lists, tuples and dicts walked)."""
    if isinstance(value, torch.Tensor):
        return tensor_form(value)
    if isinstance(value, (list, tuple)):
        return tuple(described(item, tensor_form) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((name, described(item, tensor_form)) for name, item in value.items()))
    return repr(value)


def tensor_layout(tensor: torch.Tensor) -> tuple:
    return (tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device.type)


def tensor_pattern(tensor: torch.Tensor) -> tuple:
    shape, stride = tuple(tensor.shape), tensor.stride()
    kinds = zip(shape, stride, strict=True)
    return (
        tensor.dtype,
        tensor.device.type,
        tuple((size == 0, size == 1, step == 0) for size, step in kinds),
        tuple(sorted(range(tensor.dim()), key=lambda dim: -stride[dim])),
        tensor.is_contiguous(),
        tensor.storage_offset() == 0,
    )


def writes_in_place(
    out_op: OpOverload, args: tuple, kwargs: dict, out_names: tuple[str, ...], results: list[Any]
) -> bool:
    """Whether ``out_op(*args, **kwargs, out=...)`` computes ``results`` into tensors of their
    layout without reallocating them (``results``: the functional call's, one per out name)."""
    key = (out_op, layout_of((args, kwargs)), layout_of(results))
    verdict = VERDICTS.get(key)
    if verdict is not None:
        return verdict
    pattern = (out_op, pattern_of((args, kwargs)), pattern_of(results))
    large = sum(t.nbytes for t in tensors_in(results)) >= LARGE_TRIAL_BYTES
    if large and PATTERN_VERDICTS.get(pattern):
        return True
    verdict = remember(VERDICTS, key, trial(out_op, args, kwargs, out_names, results))
    remember(PATTERN_VERDICTS, pattern, PATTERN_VERDICTS.get(pattern, True) and verdict)
    return verdict


def remember(verdicts: dict[tuple, bool], key: tuple, verdict: bool) -> bool:
    """``verdicts[key] = verdict``, the oldest verdict forgotten beyond ``VERDICT_LIMIT``."""
    verdicts[key] = verdict
    if len(verdicts) > VERDICT_LIMIT:
        del verdicts[next(iter(verdicts))]
    return verdict


def trial(
    out_op: OpOverload, args: tuple, kwargs: dict, out_names: tuple[str, ...], results: list[Any]
) -> bool:
    scratch = in_one_storage(results)
    before = storages(scratch)
    try:
        out_op(*args, **kwargs, **dict(zip(out_names, scratch, strict=True)))
    except Exception:  # an overload that refuses these outputs is not trusted with them
        return False
    return storages(scratch) == before and all(
        same_bits(got, want)
        for got, want in zip(tensors_in(scratch), tensors_in(results), strict=True)
    )


def storages(values: Any) -> list[tuple[int, int]]:
    """Where each tensor's storage is and how large: what an ``out=`` resize would change."""
    return [
        (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors_in(values)
    ]


def in_one_storage(results: list[Any]) -> list[Any]:
    """Scratch outputs of the exact layouts of ``results``, all in one storage, apart: as the
    replay's are, whose intermediates all lie in one arena. A kernel that tells its outputs'
    storages apart (``linalg_qr.out`` takes ``Q`` sharing ``R``'s storage for ``R`` itself, and
    leaves ``R`` unwritten) then fails its trial here, not on a replay."""
    tensors = tensors_in(results)
    offsets, nbytes = [], 0
    for tensor in tensors:
        offsets.append(nbytes)
        nbytes += aligned(extent(tensor) * tensor.element_size())
    device = tensors[0].device if tensors else torch.device("cpu")
    storage = torch.UntypedStorage(nbytes, device=device)
    carved = iter(
        torch.empty(0, dtype=t.dtype, device=device).set_(
            storage, offset // t.element_size(), t.shape, t.stride()
        )
        for t, offset in zip(tensors, offsets, strict=True)
    )
    return pytree.tree_map_only(torch.Tensor, lambda _: next(carved), results)


def extent(tensor: torch.Tensor) -> int:
    """Elements a tensor of this layout spans in its storage (from its first element)."""
    if tensor.numel() == 0:
        return 0
    steps = zip(tensor.shape, tensor.stride(), strict=True)
    return 1 + sum((size - 1) * step for size, step in steps)


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""An integer type of each element size: its view of a tensor compares bits, and comparing
allocates nothing of the tensor's size (a logit-sized trial at every new length adds up)."""


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or got.stride() != want.stride() or got.dtype != want.dtype:
        return False
    bits = BITS.get(got.element_size())
    try:
        if bits is not None and not got.is_complex():
            return torch.equal(got.view(bits), want.view(bits))
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    except (AssertionError, RuntimeError):  # RuntimeError: a type no integer view can read
        return False
    return True
