"""A stored graph, called in place of Dynamo's compiled function by the cached bytecode.

It checks its inputs as Dynamo's guards did (a call that does not fit raises :class:`Misfit`
before anything runs), builds the capture manager from the stored graph on first use, and maps
outputs back as AOTAutograd's runtime would (see ``graph_record``).

The check is cheap on the steady path: an input that is the very object of the last fitting
call (a parameter, a KV cache) is not checked again; only the clauses that read a new input are
evaluated.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

from npugraph_ex.cache.graph_record import INPUT_NAME, GraphRecord, referenced_inputs
from npugraph_ex.compiler import LoweredGraph, build_graph_callable
from npugraph_ex.config import Config
from npugraph_ex.errors import NpuGraphExError
from npugraph_ex.kernels.graph_bytes import load_graph
from npugraph_ex.kernels.tier import KernelStore


class Misfit(NpuGraphExError):
    """A call's inputs do not fit a stored graph; the message says which input and how."""


class CachedGraph:
    """Callable like Dynamo's compiled function for one stored graph; ``call``, where this
    process compiled the graph itself, is the callable it built (no second capture manager)."""

    def __init__(
        self,
        record: GraphRecord,
        config: Config,
        call: Callable[[list[Any]], Any] | None = None,
        kernel_store: KernelStore | None = None,
    ):
        self.record = record if call is None else without_graph(record)
        self.config = config
        self.call = call
        self.kernel_store = kernel_store
        """Where background kernels a key keeps are stored, and found by a later process."""
        self.clauses: dict[int, list[tuple[str, Any]]] = {}
        for clause in record.guards:
            code = compile(clause, "<npugraph_ex cache guard>", "eval")
            for index in referenced_inputs(clause):
                self.clauses.setdefault(index, []).append((clause, code))
        self.last: tuple[Any, ...] | None = None
        self.mutated = frozenset(record.mutated)
        self.build_seconds = 0.0

    def __call__(self, *args: Any) -> list[Any]:
        self.check(args)
        if self.call is None:
            self.call = self.build()
        outputs = self.call([None] * self.record.num_tokens + list(args))
        outputs = list(outputs)[self.record.num_tokens :]
        return [output_value(entry, outputs, args) for entry in self.record.outputs]

    def build(self) -> Callable[[list[Any]], Any]:
        started = time.perf_counter()
        record = self.record
        original = load_graph(record.original) if record.original is not None else None
        lowered = LoweredGraph(
            load_graph(record.graph),
            record.facts,
            record.host,
            record.failed_passes,
            record.name,
            original,
            record.rows,
            record.symbolic,
            load_graph(record.kernels_graph) if record.kernels_graph is not None else None,
        )
        call = build_graph_callable(lowered, self.config, self.kernel_store)
        self.record = without_graph(record)
        self.build_seconds = time.perf_counter() - started
        return call

    def check(self, args: Sequence[Any]) -> None:
        """Raise :class:`Misfit` unless ``args`` fit the stored graph."""
        last = self.last
        if last is not None and len(args) == len(last) and all(map(operator.is_, args, last)):
            return
        if len(args) != len(self.record.inputs):
            raise Misfit(
                f"{len(args)} graph inputs, the stored graph takes {len(self.record.inputs)}"
            )
        changed = [i for i in range(len(args)) if last is None or args[i] is not last[i]]
        names = self.record.input_names or [f"input {i}" for i in range(len(args))]
        for i in changed:
            check_kind(names[i], args[i], self.record.inputs[i])
        self.check_clauses(args, changed)
        self.check_aliasing(args, changed, names)
        self.last = tuple(args)

    def check_clauses(self, args: Sequence[Any], changed: list[int]) -> None:
        names = {"L": {f"t{i}": a for i, a in enumerate(args)}}
        done: set[str] = set()
        for index in changed:
            for clause, code in self.clauses.get(index, ()):
                if clause in done:
                    continue
                done.add(clause)
                if not eval(code, SYMPY_INTERP, names):  # noqa: S307 - our own guard clauses
                    raise Misfit(self.failed_guard(clause, args))

    def failed_guard(self, clause: str, args: Sequence[Any]) -> str:
        """``clause`` in the user's names: ``2 <= L['x'].size()[0]`` rather than ``L['t0']``."""
        names = self.record.input_names
        indices = sorted(referenced_inputs(clause))
        readable = INPUT_NAME.sub(lambda m: names[int(m.group(1))], clause)
        values = ", ".join(f"{names[i]} is {shown(args[i])}" for i in indices)
        return f"shape guard {readable} fails: {values}"

    def check_aliasing(self, args: Sequence[Any], changed: list[int], names: list[str]) -> None:
        if not self.mutated:
            return
        written = {args[i].untyped_storage().data_ptr(): i for i in self.mutated}
        for i in changed:
            value = args[i]
            if not isinstance(value, torch.Tensor) or value.device.type == "meta":
                continue
            owner = written.get(value.untyped_storage().data_ptr())
            if owner is not None and owner != i:
                raise Misfit(
                    f"{names[i]} shares memory with {names[owner]}, which the graph writes"
                )


def without_graph(record: GraphRecord) -> GraphRecord:
    """``record`` without its pickled graphs, once a capture manager exists for them."""
    return dataclasses.replace(record, graph=b"", original=None, kernels_graph=None)


def output_value(entry: tuple[Any, ...], outputs: list[Any], args: Sequence[Any]) -> Any:
    """One user output, as AOTAutograd's runtime returns it (see ``GraphRecord.outputs``)."""
    kind = entry[0]
    if kind == "graph":
        return outputs[entry[1]]
    if kind == "input":
        return args[entry[1]]
    out, base = outputs[entry[1]], args[entry[2]]
    return base.as_strided(out.size(), out.stride(), out.storage_offset())


def check_kind(name: str, value: Any, kind: tuple[Any, ...]) -> None:
    if kind[0] == "int":
        if not isinstance(value, int):
            raise Misfit(f"{name} is a {type(value).__name__}, the stored graph took an int")
        return
    if kind[0] == "tensor":
        _, dtype, device, requires_grad = kind
        if not isinstance(value, torch.Tensor):
            raise Misfit(f"{name} is a {type(value).__name__}, the stored graph took a tensor")
        if value.dtype != dtype or value.device != device:
            raise Misfit(
                f"{name} is {value.dtype} on {value.device}, the stored graph took "
                f"{dtype} on {device}"
            )
        if value.requires_grad != requires_grad and torch.is_grad_enabled():
            raise Misfit(f"{name} has requires_grad={value.requires_grad}")
        return
    raise Misfit(f"{name}: the stored graph took a {kind[1]}")


def shown(value: Any) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
