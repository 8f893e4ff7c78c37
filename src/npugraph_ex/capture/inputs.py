"""How a call's inputs map to a graph key and to the static inputs a capture reads.

Each input of the optimised graph has one role, fixed when the graph is compiled:

- ``static``: parameters and buffers. Used in place, never copied; their addresses are part of the
  key unless ``frozen_parameter`` promises they never move.
- ``mutated``: inputs the graph writes (a KV cache). Used in place so the write lands in the
  caller's tensor; shape in the key, address checked against the capture on every call. A graph
  whose written inputs arrive at a new address call after call copies them instead
  (``written_copied``): into buffers of the key's own before each replay, and back after it.
- ``host_scalar``: 0-d CPU tensors feeding a device graph. Their value is baked into the capture,
  so the value is part of the key. Staged as a copy in pinned memory, from which a capture can
  record a copy to the device (not from pageable memory).
- ``copied``: every other tensor. Copied into a static buffer before each replay; shape and
  strides in the key. The buffers are the key's own, made once by the device's runtime where
  its graphs read them (``DeviceRuntime.input_buffers``: in the graph's pool on CUDA).
- ``value``: ints (sizes of dynamic dimensions), effect tokens (None at run time) and other
  Python values; part of the key.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.capture.analysis import GraphFacts
from npugraph_ex.errors import CaptureError
from npugraph_ex.fixed_views import alias_of
from npugraph_ex.runtime.base import InputBuffers


@dataclass(frozen=True)
class StagedInputs:
    """The arguments one capture runs on, and which of them are refreshed from each call."""

    args: list[Any]
    copies: tuple[tuple[int, torch.Tensor], ...]
    mutated_addresses: tuple[int, ...]
    parameter_addresses: tuple[int, ...]
    parameters: tuple[weakref.ref, ...] = ()
    """The caller's parameter and buffer tensors, weakly: the capture holds aliases of them (its
    own tensor objects over the same memory), so a parameter the model replaced can die."""
    hold: Any = None
    """What keeps the memory of the key's own input buffers (``copies``) usable while the key
    lives: a hold of the graph's pool they were allocated in (``InputBuffers``), or None."""
    written_back: tuple[tuple[int, torch.Tensor], ...] = ()
    """The buffers of written inputs (``InputLayout(written_copied=True)``): copied back into the
    caller's tensors after each replay."""
    buffers_as_called: bool = True
    """Whether every buffer has the strides of the input it copies (the key's strides). Not so
    for an input no copy can keep the layout of (``expand``ed, or sliced with steps): kernels
    compiled for the buffers then read those, never the caller's own tensors."""

    def parameters_current(self) -> bool:
        """Whether every parameter and buffer the capture read is alive and still holds the
        memory it was captured with. One that died (``lin.weight = Parameter(new)``) or was
        given new memory (``lin.weight.data = new``) can never match this key again, while the
        capture's aliases keep its old bytes alive."""
        for ref, address in zip(self.parameters, self.parameter_addresses, strict=True):
            tensor = ref()
            if tensor is None or tensor.data_ptr() != address:
                return False
        return True


class InputLayout:
    """The role of every graph input, and the per-call operations derived from it."""

    def __init__(self, facts: GraphFacts, *, frozen: bool, written_copied: bool = False):
        self.static = tuple(sorted(facts.static_indices - facts.mutated_indices))
        self.mutated = tuple(sorted(facts.mutated_indices))
        self.host_scalar = tuple(sorted(facts.host_scalar_indices - facts.mutated_indices))
        roles = set(self.static) | set(self.mutated) | set(self.host_scalar)
        tensors = facts.tensor_indices
        self.copied = tuple(sorted(tensors - roles))
        self.values = tuple(i for i in range(facts.num_inputs) if i not in roles | tensors)
        # ``written_copied``: written inputs get buffers of the key's own, as copied ones do,
        # and are copied back after each replay; their addresses leave the check.
        self.addressed = () if written_copied else self.mutated
        self.buffered = tuple(sorted(self.copied + (self.mutated if written_copied else ())))
        self.pinned = facts.device_type != "cpu"
        self.keyed_addresses = () if frozen else self.static
        self.shaped = self.copied + self.mutated
        self.last_parameter_addresses: tuple[int, ...] = ()

    def key_of(self, args: Sequence[Any]) -> tuple:
        """The graph key of a call: everything that selects a different capture."""
        shaped = [args[i] for i in self.shaped]
        return (
            tuple([t.shape for t in shaped]),
            tuple([t.stride() for t in shaped]),
            tuple([args[i] for i in self.values]),
            tuple([args[i].item() for i in self.host_scalar]),
            addresses(args, self.keyed_addresses),
        )

    @staticmethod
    def without_values(key: tuple) -> tuple:
        """A key's shapes, strides and addresses: what keys differing only in values share."""
        shapes, strides, _, _, keyed_addresses = key
        return shapes, strides, keyed_addresses

    def describe(self, key: tuple) -> str:
        """A short, readable form of a key's shapes and values (addresses left out)."""
        shapes = ", ".join("x".join(map(str, shape)) or "scalar" for shape in key[0])
        return f"shapes=[{shapes}] {self.describe_values(key)}"

    @staticmethod
    def describe_values(key: tuple) -> str:
        """A key's int and host scalar input values, as ``values=[...]``."""
        return f"values=[{', '.join(map(str, key[2] + key[3]))}]"

    def mutated_addresses(self, args: Sequence[Any]) -> tuple[int, ...]:
        return addresses(args, self.addressed)

    def parameter_addresses(self, args: Sequence[Any]) -> tuple[int, ...]:
        return addresses(args, self.static)

    def interned(self, parameter_addresses: tuple[int, ...]) -> tuple[int, ...]:
        """The previous capture's tuple when equal: the keys of a graph mostly share their
        parameters' addresses, and each tuple holds an int object per parameter."""
        if parameter_addresses != self.last_parameter_addresses:
            self.last_parameter_addresses = parameter_addresses
        return self.last_parameter_addresses

    def stored_key(self, key: tuple) -> tuple:
        """``key`` (from ``key_of``) as a new capture keeps it: its addresses (the parameters'
        where they are keyed) as the tuple the staged inputs hold (``interned``; call after
        ``stage``), not one more int object per parameter for every key."""
        return (*key[:4], self.interned(key[4])) if key[4] else key

    def check_frozen(self, args: Sequence[Any], staged: StagedInputs, graph: str, key: str) -> None:
        """Raise when a parameter or buffer is not where ``staged`` captured it, as
        ``frozen_parameter=True`` promised it would be (``key`` of ``graph``)."""
        index = self.moved_parameter(args, staged.parameter_addresses)
        if index is None:
            return
        raise CaptureError(
            f"{graph}: parameter or buffer input {index} moved since {key} was captured, and "
            "with frozen_parameter=True the replay would read its old memory. Update parameters "
            "in place (param.copy_(new)), or set options={'frozen_parameter': False} to key "
            "graphs on their addresses."
        )

    def moved_parameter(self, args: Sequence[Any], captured: Sequence[int]) -> int | None:
        """The first parameter or buffer input not at its ``captured`` address, else None."""
        for index, address in zip(self.static, captured, strict=True):
            if args[index].data_ptr() != address:
                return index
        return None

    def stage(
        self, args: Sequence[Any], buffers: Callable[[list[torch.Tensor]], InputBuffers] | None
    ) -> StagedInputs:
        """Static inputs for a new capture: the key's own buffers where ``buffers`` makes them
        (``DeviceRuntime.input_buffers`` for the key's pool; ``clone_input``), else the call's
        own tensors; parameters as aliases (``StagedInputs.parameters``)."""
        staged = list(args)
        for index in self.static:
            staged[index] = alias_of(args[index])
        if self.pinned:
            for index in self.host_scalar:
                staged[index] = pinned_copy(args[index])
        sources = [args[i] for i in self.buffered]
        made = buffers(sources) if buffers is not None and sources else InputBuffers(sources)
        copies = tuple(zip(self.buffered, made.tensors, strict=True))
        for index, buffer in copies:
            staged[index] = buffer
        return StagedInputs(
            staged,
            copies,
            self.mutated_addresses(args),
            self.interned(self.parameter_addresses(args)),
            tuple(weakref.ref(args[i]) for i in self.static),
            made.hold,
            tuple((index, buffer) for index, buffer in copies if index in self.mutated),
            all(buffer.stride() == args[index].stride() for index, buffer in copies),
        )


def pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` in page-locked memory, or ``tensor`` where none can be had."""
    try:
        return torch.empty_like(tensor, pin_memory=True).copy_(tensor)
    except RuntimeError:  # no accelerator to pin for
        return tensor


def addresses(args: Sequence[Any], indices: Sequence[int]) -> tuple[int, ...]:
    """The data addresses of the tensor inputs at ``indices``."""
    return tuple([args[i].data_ptr() for i in indices])


def refresh(copies: Sequence[tuple[int, torch.Tensor]], args: Sequence[Any]) -> None:
    """Copy a call's inputs into the static buffers a capture reads."""
    for index, buffer in copies:
        source = args[index]
        if source.data_ptr() != buffer.data_ptr():
            buffer.copy_(source)


def write_back(written: Sequence[tuple[int, torch.Tensor]], args: Sequence[Any]) -> None:
    """Copy the buffers of written inputs back into the call's own tensors."""
    for index, buffer in written:
        target = args[index]
        if target.data_ptr() != buffer.data_ptr():
            target.copy_(buffer)


@dataclass
class Snapshot:
    """What a run the caller must not see (a warm-up, a capture that failed, the kernels' run
    beside the ATen replay's) changes, as it was before: copies of the inputs the graph writes,
    and for a graph with random ops the CPU's generator, which they draw from as eager's do (the
    call that follows draws eager's numbers)."""

    written: list[tuple[torch.Tensor, torch.Tensor]]
    random_state: torch.Tensor | None


def snapshot(args: Sequence[Any], indices: Sequence[int], draws_random: bool) -> Snapshot:
    random_state = torch.get_rng_state() if draws_random else None
    return Snapshot([(args[i], args[i].clone()) for i in indices], random_state)


def restore(saved: Snapshot) -> None:
    with torch.no_grad():
        for target, saved_value in saved.written:
            target.copy_(saved_value)
    if saved.random_state is not None:
        torch.set_rng_state(saved.random_state)
