"""The interface every device runtime implements.

A runtime knows how to turn "call this function on these static inputs" into a graph object that
re-runs the same kernels into the same memory. Everything else (graph keys, static inputs, limits,
fallbacks, counters) is device-independent policy and lives in ``npugraph_ex.capture``.

Invariant shared by every runtime: ``capture(program, args, pool)`` returns the graph and the
capturing call's outputs; the graph's ``outputs`` are tensors in memory owned by the graph (or its
pool); each ``replay()`` recomputes them in place from whatever the tensors in ``args`` hold at
that moment and returns them for the caller. ``args`` must stay alive and at the same addresses
for the graph's whole life.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def as_output_list(result: Any) -> list[Any]:
    """A graph's outputs as a list (AOT graphs return a tuple; a plain graph may return one)."""
    return [result] if isinstance(result, torch.Tensor) else list(result)


@dataclass(frozen=True)
class Program:
    """What to capture for one key, as the compiler decides it: a function of the key's static
    inputs, and which kind of function it is.

    ``kind``: ``"graph"``, ATen kernels (the optimised graph, or its specialisation for the key's
    sizes); ``"watched"``, the optimised graph (an FX ``GraphModule``) run so that a replay can
    be read node by node (tensor dumps; runtimes that cannot, capture it as a graph);
    ``"kernels"``, compiled kernels (``static_kernel_compile``), which a runtime recording ATen
    kernels keeps as one call.
    """

    fn: Callable[..., Any]
    kind: str = "graph"
    capture_error_mode: str = "global"
    disabled_steps: frozenset[str] = frozenset()
    """Names of the runtime's build steps to skip (``disabled_build_steps``)."""


class CapturedGraph(ABC):
    """One captured graph: fixed inputs in, fixed outputs out."""

    outputs: list[Any]
    """The graph's own outputs; replay rewrites them in place."""

    @abstractmethod
    def replay(self) -> list[Any]:
        """Re-run every captured kernel into the same memory; the outputs, for the caller."""

    @abstractmethod
    def release(self) -> None:
        """Drop the graph and the memory it holds; the graph must not be replayed again."""

    @property
    @abstractmethod
    def pool_bytes(self) -> int:
        """Bytes of intermediates and outputs the graph keeps alive."""

    @property
    def kernel_count(self) -> int | None:
        """Kernels one replay launches, where the runtime can tell."""
        return None

    def replay_on(self, args: Sequence[Any]) -> list[Any] | None:
        """Replay reading the caller's ``args`` themselves, where this graph can (compiled
        kernels take any tensors of the key's sizes): the call's inputs are then not copied into
        the key's own buffers first. None where the graph reads only its own buffers."""
        return None


@dataclass(frozen=True)
class InputBuffers:
    """A key's own input buffers (``DeviceRuntime.input_buffers``) and what keeps the memory
    they lie in usable: a hold of the graph's pool where they were allocated in it, else None.
    The key holds both as long as it lives (``capture.inputs.StagedInputs``)."""

    tensors: list[torch.Tensor]
    hold: Any = None


@dataclass(frozen=True)
class Capture:
    """What a capture returns: the graph, and the outputs the capturing call returns."""

    graph: CapturedGraph
    outputs: list[Any]


class DeviceRuntime(ABC):
    """Captures and replays graphs on one device type."""

    name: str
    """Device type, as in ``torch.device(name)``."""

    @abstractmethod
    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        """Run ``fn(*args)`` eagerly ``iters`` times so that lazy library state exists."""

    @abstractmethod
    def capture(
        self, program: Program, args: Sequence[Any], pool: Any, owned_inputs: Sequence[int] = ()
    ) -> Capture:
        """Capture ``program`` run on ``args`` into a graph drawing memory from ``pool``.

        ``owned_inputs``: indices of ``args`` that are the graph's own input buffers (made by
        ``input_buffers``; the caller's values are copied into them before each replay): a
        runtime that plans a graph's memory after recording it (CPU) may place them in ``pool``
        with the plan, where they share bytes with other captures, as intermediates do. A
        capture that fails may have run part of the program: the caller undoes its writes.
        """

    def input_buffers(self, sources: Sequence[torch.Tensor], pool: Any) -> InputBuffers:
        """A key's own input buffers, one copy of each of ``sources`` (values, sizes and
        strides), each allocated once, where the key's graphs will read it: in ``pool`` where
        the device can allocate there before a capture (CUDA), else where the allocator puts
        it (CPU places them with its memory plan, ``capture``). Every capture of the key (its
        ATen graph, then its kernels) reads the same buffers."""
        return InputBuffers([s.clone(memory_format=torch.preserve_format) for s in sources])

    @abstractmethod
    def new_pool(self) -> Any:
        """A fresh memory pool handle for graphs that should share memory."""

    def hold_pool(self, pool: Any) -> Any:
        """Something whose life keeps ``pool`` usable by later captures, however many of the
        graphs captured into it are released meanwhile; None where a handle is enough."""
        return None

    @abstractmethod
    def accepts_pool(self, pool: Any) -> bool:
        """Whether ``pool`` is a pool handle of this device."""

    @abstractmethod
    def pool_bytes(self, pool: Any) -> int:
        """Bytes the captures placed in ``pool`` hold through it."""

    def synchronize(self) -> None:
        """Wait for the device to finish queued work (no-op where work is synchronous)."""
        return None

    def warms_up(self, kind: str) -> bool:
        """Whether a capture of a program of ``kind`` (``Program.kind``) is preceded by the
        ``num_warmup_iters`` eager runs: a device graph records what lazily made library state
        would otherwise be made during the recording."""
        return True

    def limits_cores(self) -> bool:
        """Whether a replay re-runs ``limit_core_num`` scopes (``npugraph_ex.scope``), so the
        ops inside run on fewer cores; elsewhere the scope only bounds the passes (the compiler
        says so once)."""
        return False

    def default_stream(self, stream_id: int) -> bool:
        """Whether the device's stream numbered ``stream_id`` is its default stream, which a
        graph's work runs on unless told otherwise (a wait on it or a scope naming it is a wait
        on the graph's own lane)."""
        return False

    def loading_facts(self) -> contextlib.AbstractContextManager[dict[Any, Any]]:
        """In a compile process, around a compile: the facts of this host the load of its
        kernels in the serving process would otherwise find out itself (``prepare_kernel_
        loading``), filled in when the block ends; none by default."""
        return contextlib.nullcontext({})

    def prepare_kernel_loading(self, facts: dict[Any, Any]) -> None:
        """In the serving process, before a load (``kernels/loading``): take the ``facts`` a
        compile process sent, so that the first load in the process does not find them out
        itself (on CPU, the vector-instruction probes: a second of Python calls)."""
        return None

    def replays_watched(self) -> bool:
        """Whether the runtime's graph of a ``"watched"`` program can be replayed node by node
        (``replay_watched``): tensor dumps of replayed calls (``capture/dumping``)."""
        return False

    def pool_lock(self, pool: Any) -> threading.RLock:
        """The lock under which a call stages its inputs, replays and takes its outputs.

        Captures that share ``pool`` share bytes, so one call's input copies, replay and output
        clones must not interleave with another's. One lock per runtime by default.
        """
        return RUNTIME_LOCKS.setdefault(self.name, threading.RLock())


RUNTIME_LOCKS: dict[str, threading.RLock] = {}
"""The default ``pool_lock`` of each device type."""
