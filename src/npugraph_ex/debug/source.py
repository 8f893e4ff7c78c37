"""Where in the user's code a graph node came from, for messages."""

from __future__ import annotations

import torch.fx


def source_line(node: torch.fx.Node) -> str:
    """The user source line a node came from (last frame of its stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [line for line in lines if line.startswith("File ")]
    if not frames:
        return "<unknown source>"
    code_index = lines.index(frames[-1]) + 1
    code = f": {lines[code_index]}" if code_index < len(lines) else ""
    return f"{frames[-1]}{code}"
