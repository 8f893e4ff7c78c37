"""Where in the user's code a graph node came from, for messages."""

from __future__ import annotations

import os

import torch
import torch.fx

LIBRARY_FILES = tuple(
    f'File "{os.path.dirname(package)}{os.sep}'
    for package in (torch.__file__, os.path.dirname(__file__))
)
"""How a stack-trace frame inside torch's package, or this one, starts."""


def source_line(node: torch.fx.Node) -> str:
    """The user source line a node came from: the innermost frame of its stack trace outside
    torch's package and this one (``dist.all_reduce`` or ``npu_tagged_event_wait`` is reported
    where the model calls it, not inside the library), else the innermost frame."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [line for line in lines if line.startswith("File ")]
    if not frames:
        return "<unknown source>"
    outside = [line for line in frames if not line.startswith(LIBRARY_FILES)]
    frame = (outside or frames)[-1]
    code_index = lines.index(frame) + 1
    code = f": {lines[code_index]}" if code_index < len(lines) else ""
    return f"{frame}{code}"
