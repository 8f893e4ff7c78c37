"""Capture of the CPU replay engine: run the graph once and record every kernel it launches.

The recorder is a dispatch mode that sees every ATen kernel with the exact tensors it reads and
writes, runs it, and records the step that recomputes it in place (``steps``), the stream block
it ran in (``lanes``) and the storages it allocated (``release``, ``memory``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from npugraph_ex.errors import CaptureError
from npugraph_ex.runtime.cpu.lanes import (
    Lane,
    LaneTracker,
    is_join,
    join_step,
)
from npugraph_ex.runtime.cpu.release import Releaser, allocated_storages
from npugraph_ex.runtime.cpu.steps import SYNCHRONOUS_NAMESPACES, Step, plan_step
from npugraph_ex.schemas import CONTROL_FLOW

WITH_EFFECTS = torch.ops.higher_order.with_effects


class KernelRecorder(TorchDispatchMode):
    """Runs kernels normally and records, for each, the step that recomputes it in place.

    Of the higher-order ops, ``with_effects`` (AOTAutograd wraps ops with side effects in it,
    such as linalg's error checks) has its op recorded and always re-issued, whether or not it
    returns anything; control flow (``schemas.CONTROL_FLOW``: ``torch.cond``, ``flex_attention``)
    runs as eager runs it, its inner kernels unrecorded, and is re-issued whole.
    """

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Step] = []
        self.step_kinds: Counter[str] = Counter()
        self.produced: list[Any] = []
        self.lanes = LaneTracker()
        self.step_lanes: list[Lane] = []
        """The stream block each step runs in (None: the main path)."""
        self.allocated: set[int] = set()
        """The storages (by ``storage_key``) the kernels allocated: the ones memory planning may
        move. A view of a graph constant or an input is not one of them."""
        self.releaser: Releaser | None = None
        """With one, the storages each kernel allocates are freed once dead (``release``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is WITH_EFFECTS:
            return self.record_effect(*args, **kwargs)
        if not isinstance(func, OpOverload) and func not in CONTROL_FLOW:
            raise CaptureError(f"the CPU replay engine cannot record {func}")
        lane = self.lanes.lane_of(func, args, kwargs)
        result = func(*args, **kwargs)
        planned = (
            ("join", join_step(*args)) if is_join(func) else plan_step(func, args, kwargs, result)
        )
        self.track_storages(func, args, kwargs, result)
        self.record(planned, result, lane)
        return result

    def track_storages(self, op: OpOverload, args: tuple, kwargs: dict, result: Any) -> None:
        """Note the storages ``op`` allocated, and hand them to the releaser if there is one."""
        allocated = allocated_storages(args, kwargs, result)
        self.allocated.update(key for key, _ in allocated)
        if self.releaser is not None:
            self.releaser.allocated(allocated)
            if op.namespace not in SYNCHRONOUS_NAMESPACES:
                self.releaser.pin((args, kwargs))

    def record(self, planned: tuple[str, Step] | None, result: Any, lane: Lane = None) -> None:
        if planned is not None:
            kind, step = planned
            self.steps.append(step)
            self.step_kinds[kind] += 1
            self.step_lanes.append(lane)
        # Every result stays alive for the graph's life: its address is part of the graph.
        self.produced.append(result)

    def record_effect(self, token: Any, op: OpOverload, *args: Any, **kwargs: Any) -> tuple:
        result = op(*args, **kwargs)
        planned = plan_step(op, args, kwargs, result) or ("effect", (op, args, kwargs))
        self.track_storages(op, args, kwargs, result)
        self.record(planned, result, self.lanes.current)
        new_token = torch.empty(0)
        return (new_token, *result) if isinstance(result, tuple) else (new_token, result)
