"""The CPU replay engine: a device graph for a device that has none.

Capture runs the graph once under a dispatch mode that sees every ATen kernel with the exact
tensors it reads and writes, and keeps every tensor it produces alive, so no two tensors of the
graph ever share an address by accident. Replay re-issues the planned steps (see ``cpu_steps``)
into that same memory: no allocation for kernels with an ``out=`` overload, no view
recomputation, no FX interpretation, one tight loop below autograd.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from npugraph_ex.runtime.base import CapturedGraph, DeviceRuntime, as_output_list
from npugraph_ex.runtime.cpu_bindings import fastest_call
from npugraph_ex.runtime.cpu_steps import Step, plan_step, storages_of


class KernelRecorder(TorchDispatchMode):
    """Runs kernels normally and records, for each, the step that recomputes it in place."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Step] = []
        self.step_kinds: Counter[str] = Counter()
        self.produced: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        planned = plan_step(func, args, kwargs, result)
        if planned is not None:
            kind, step = planned
            self.steps.append(step)
            self.step_kinds[kind] += 1
        # Every result stays alive for the graph's life: its address is part of the graph.
        self.produced.append(result)
        return result


class CpuGraph(CapturedGraph):
    """The recorded steps of one capture, with the memory they write."""

    def __init__(self, recorder: KernelRecorder, outputs: list[Any], inputs: Any):
        self.steps = [
            (fastest_call(fn, args, kwargs) if isinstance(fn, OpOverload) else fn, args, kwargs)
            for fn, args, kwargs in recorder.steps
        ]
        self.step_kinds = recorder.step_kinds
        """How many steps run through an ``out=`` overload, in place, or compute-and-copy."""
        self.outputs = outputs
        self.produced = recorder.produced
        self._pool_bytes = owned_bytes(self.produced, inputs)

    def replay(self) -> None:
        # Below autograd: replay is inference-only and every tensor is already in place.
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for fn, args, kwargs in self.steps:
                fn(*args, **kwargs)

    def release(self) -> None:
        self.steps = []
        self.outputs = []
        self.produced = []
        self._pool_bytes = 0

    @property
    def pool_bytes(self) -> int:
        return self._pool_bytes

    @property
    def kernel_count(self) -> int:
        return len(self.steps)


def owned_bytes(produced: list[Any], inputs: Any) -> int:
    """Bytes of the distinct storages a capture allocated (inputs and parameters excluded)."""
    external = storages_of(inputs)
    sizes: dict[int, int] = {}
    for tensor in torch.utils._pytree.tree_leaves(produced):
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in external:
                sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


class CpuPool:
    """A CPU pool handle. Graphs given the same handle may share memory."""

    def __repr__(self) -> str:
        return f"CpuPool(id=0x{id(self):x})"


class CpuRuntime(DeviceRuntime):
    name = "cpu"
    capture_executes = True

    def warmup(self, fn: Callable[..., Any], args: Sequence[Any], iters: int) -> None:
        with torch.no_grad():
            for _ in range(iters):
                fn(*args)

    def capture(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        *,
        pool: Any,
        capture_error_mode: str,
    ) -> CpuGraph:
        recorder = KernelRecorder()
        with torch.no_grad(), recorder:
            outputs = as_output_list(fn(*args))
        return CpuGraph(recorder, outputs, list(args))

    def new_pool(self) -> CpuPool:
        return CpuPool()
