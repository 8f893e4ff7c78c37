"""Steps whose results no replay can change: run once at capture, not on every replay.

Part of a graph depends only on the sizes of a key, which are fixed, not on any input's values:
the positions ``arange(n)`` of a forward without a cache, the causal mask built from them, the
scalars its comparisons make. Every replay would recompute the same bytes. A step is *constant*
when everything it reads is a constant tensor of the graph or the result of constant steps
before it, and everything it writes is written by constant steps only. Those steps run once,
when the key is captured, into memory of their own (outside the pool, whose bytes other keys and
later steps reuse); the replay skips them.

    captured:  arange.out(20, out=P); le.Tensor_out(P, P', out=M); where.self_out(M, x, y, out=Z)
    replayed:  where.self_out(M, x, y, out=Z)            (P and M hold their captured values)

What never folds: a step that reads an input, a parameter or a buffer (their values may change
between calls), a random kernel, anything but an ATen or prims kernel (collectives, custom ops,
host effects), a step that writes an output (the caller may change it in place), and a step
writing a storage larger than ``MAX_BYTES``: a constant keeps its memory for the key's life, where
the pool shares an intermediate's bytes between keys (a float causal mask of 2048 positions is
16 MiB).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload

from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import first_line
from npugraph_ex.runtime.cpu.lanes import wait_nothing
from npugraph_ex.runtime.cpu.memory import storage_key, storage_keys
from npugraph_ex.runtime.cpu.steps import COMPUTED_BY, SYNCHRONOUS_NAMESPACES, Step
from npugraph_ex.runtime.tensors import tensors_in

MAX_BYTES = 8 * 1024
"""Largest storage a constant step may write (a float mask of 45 x 45 positions). A constant
keeps its bytes for the key's life, so a graph with many keys keeps many: the tiny Qwen3's keys
keep 1 KiB at 8 tokens, 19 KiB at 35 (four layers' copies of the float mask), 4 to 7 KiB from
64 on, where the masks no longer fold. The kernels worth skipping are the small ones, whose fixed
cost is most of their time."""

SHARED_BYTES = 8
"""Constants of at most this many bytes (the scalars a mask is filled with, one element each)
are shared by every capture of the process that computed the same bytes (``shared_storage``):
each key would otherwise keep a tensor, a storage and their bookkeeping, several hundred bytes,
for four bytes of value."""

SHARED: dict[bytes, torch.UntypedStorage] = {}
"""By content, the one storage of each small constant; the oldest forgotten beyond
``SHARED_LIMIT`` (the captures using it keep it)."""
SHARED_LIMIT = 256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Access:
    """The storages (``cpu_memory.storage_key``) one step reads and writes."""

    reads: frozenset[int]
    writes: frozenset[int]


def step_op(step: Step) -> OpOverload | None:
    """The ATen or prims kernel a step runs (itself, or the op of a compute-and-copy step), or
    None: a collective, a custom op, a host effect, whose effects a schema may not tell."""
    fn = step[0]
    op = fn if isinstance(fn, OpOverload) else COMPUTED_BY.get(fn)
    if not isinstance(op, OpOverload) or op.namespace not in SYNCHRONOUS_NAMESPACES:
        return None
    return op


def foldable_op(op: OpOverload | None) -> bool:
    """Whether ``op`` (a ``step_op``) is known, its result depends on its arguments alone (no
    seed) and it changes no tensor's geometry."""
    unfit = {torch.Tag.nondeterministic_seeded, torch.Tag.inplace_view}
    return op is not None and not unfit & set(op.tags)


def schema_access(op: OpOverload, args: tuple, kwargs: dict) -> Access:
    """Reads and writes of a call of ``op``, from its schema's alias annotations."""
    reads: set[int] = set()
    writes: set[int] = set()
    for position, argument in enumerate(op._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written = argument.alias_info is not None and argument.alias_info.is_write
        (writes if written else reads).update(storage_key(t) for t in tensors_in(value))
    return Access(frozenset(reads), frozenset(writes))


def step_access(step: Step) -> Access | None:
    """What a recorded step reads and writes, or None where that is not known (a step without a
    ``step_op``, other than a join)."""
    fn, args, kwargs = step
    if fn is wait_nothing:  # a stream block's join: it waits, touching no tensor
        return Access(frozenset(), frozenset())
    op = step_op(step)
    if op is None:
        return None
    if isinstance(fn, OpOverload):
        return schema_access(op, args, kwargs)
    targets, *call_args = args  # a compute-and-copy step (``steps``)
    access = schema_access(op, tuple(call_args), kwargs)
    written = frozenset(storage_key(t) for t in targets)
    return Access(access.reads | access.writes, access.writes | written)


def constant_steps(
    steps: Sequence[Step], varying: set[int], constants: set[int], sizes: dict[int, int]
) -> dict[int, Access]:
    """The constant steps of ``steps``: their indices, in order, and what each writes and reads.

    ``varying``: storages whose values may change between replays (inputs, parameters, buffers,
    outputs). What an asynchronous op (a collective) reads or writes varies too: its step's
    effects are not ``step_access``'s to tell, so every tensor it touches counts as written.
    ``constants``: storages no kernel allocated that are not varying (the graph's own constant
    tensors). ``sizes``: bytes of each storage.
    """
    access = [step_access(step) for step in steps]
    candidates = {
        i
        for i, a in enumerate(access)
        if a is not None
        and foldable_op(step_op(steps[i]))
        and all(sizes.get(key, 0) <= MAX_BYTES for key in a.writes)
    }
    # Every tensor a step of unknown effects touches counts as written.
    unknown = storage_keys([step[1:] for step, a in zip(steps, access, strict=True) if a is None])
    while True:
        written_by: dict[int, list[int]] = {}
        for i in sorted(candidates):
            for key in access[i].writes:
                written_by.setdefault(key, []).append(i)
        changing = varying | unknown
        for i, a in enumerate(access):
            if i in candidates or a is None:
                continue
            changing.update(a.writes)
            # A value read between two constant writes is not the one every replay ends with.
            changing.update(k for k in a.reads if k in written_by and read_midway(i, written_by[k]))
        kept = {
            i
            for i in candidates
            if not (access[i].reads | access[i].writes) & changing
            and all(reads_settled(i, key, written_by, constants) for key in access[i].reads)
        }
        if kept == candidates:
            return {i: access[i] for i in sorted(kept)}
        candidates = kept


def read_midway(index: int, writers: list[int]) -> bool:
    return writers[0] < index < writers[-1]


def reads_settled(
    index: int, key: int, written_by: dict[int, list[int]], constants: set[int]
) -> bool:
    """Whether step ``index`` reads a value of ``key`` that is the same on every replay: a
    constant tensor, or a storage every write of which comes before (or, for an in-place step, at)
    ``index``, after at least one earlier write."""
    writers = written_by.get(key)
    if writers is None:
        return key in constants
    return writers[0] < index and writers[-1] <= index


def shared_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The process's one storage holding the bytes of ``storage`` (a small constant's)."""
    content = bytes(storage.tolist())
    found = SHARED.get(content)
    if found is None:
        found = SHARED[content] = storage
        if len(SHARED) > SHARED_LIMIT:
            del SHARED[next(iter(SHARED))]
    return found


class Constants:
    """The constant steps of one capture, run once into memory of their own.

    Built from the capture's recorder: which steps are constant (``constant_steps``), the
    storages they write (left out of memory planning: they keep their own bytes, given back
    where the capture freed them as dead) and a run of those steps, so that the values are in
    place before the first replay. Of what they wrote, a key keeps only what a replayed step
    reads (``storages``); the rest (the ``arange`` a mask was built from) is freed with the step
    list, which is not kept either (``count`` says how many steps there were).
    """

    def __init__(self, recorder: Any, varying: set[int], released: dict[int, int]):
        steps = recorder.steps
        stored = {storage_key(t): t.untyped_storage() for t in tensors_in(steps)}
        sizes = {key: released.get(key) or s.nbytes() for key, s in stored.items()}
        constants = set(stored) - recorder.allocated - varying
        found = constant_steps(steps, varying, constants, sizes)
        self.folded = frozenset(found)
        self.count = len(found)
        written = {key for access in found.values() for key in access.writes}
        for key in written:
            if stored[key].nbytes() == 0 and released.get(key):
                stored[key].resize_(released[key])
        replayed = [step[1:] for step in self.others(steps)]
        read = written & storage_keys(replayed)
        with torch.no_grad(), torch._C._AutoDispatchBelowADInplaceOrView():
            for i in found:
                fn, args, kwargs = steps[i]
                fn(*args, **kwargs)
            small = {k: shared_storage(stored[k]) for k in read if sizes[k] <= SHARED_BYTES}
            for tensor in tensors_in(replayed):
                storage = small.get(storage_key(tensor))
                if storage is not None:
                    tensor.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())
        self.storages = frozenset(read)
        """The storages constant steps wrote that a replayed step reads: never moved."""
        self.nbytes = sum(sizes[key] for key in read - small.keys())
        """What of them this key alone keeps (not shared with other captures)."""

    @classmethod
    def of(cls, recorder: Any, varying: set[int], released: dict[int, int]) -> Constants:
        """The constant steps of a capture, or none where finding or running them raised (said
        once at WARNING): the capture then replays every step, as without this."""
        try:
            return cls(recorder, varying, released)
        except Exception as error:
            log_once(
                log,
                logging.WARNING,
                ("constant steps", type(error).__name__),
                "npugraph_ex: running a capture's constant steps once failed (%s: %s); its "
                "replay runs every step",
                type(error).__name__,
                first_line(error),
            )
            return cls.none()

    @classmethod
    def none(cls) -> Constants:
        """No constant steps (a capture that replays every step)."""
        empty = cls.__new__(cls)
        empty.folded, empty.storages, empty.count, empty.nbytes = frozenset(), frozenset(), 0, 0
        return empty

    def others(self, per_step: Sequence[Any]) -> list[Any]:
        """Of ``per_step`` (the recorded steps, or anything listed one per step, such as their
        stream lanes), the entries of the steps a replay runs: all but the constant ones."""
        return [item for i, item in enumerate(per_step) if i not in self.folded]
