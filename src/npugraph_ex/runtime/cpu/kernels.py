"""Compiled kernels on CPU: the call itself is the replay.

Inductor's C++ kernels fuse many ATen ops into loops that no dispatch mode sees, so the CPU
engine cannot record them step by step; it keeps the compiled call and its static inputs instead.
The compiled code allocates its own buffers on every call, so every replay returns fresh outputs
and no pool holds anything for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.base import CapturedGraph, as_output_list


class CompiledKernelCall(CapturedGraph):
    """Compiled kernels bound to one key's static inputs."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any]):
        self.fn = fn
        self.args = tuple(args)
        self.outputs = []

    def replay(self) -> list[Any]:
        return self.replay_on(self.args)

    def replay_on(self, args: Sequence[Any]) -> list[Any]:
        with torch.no_grad():
            return as_output_list(self.fn(*args))

    def release(self) -> None:
        self.fn = None  # type: ignore[assignment]
        self.args = ()

    @property
    def pool_bytes(self) -> int:
        return 0
