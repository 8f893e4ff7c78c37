"""The one place that checks the torch version.

Code elsewhere asks :func:`torch_at_least` instead of parsing ``torch.__version__`` itself, so a
version-dependent branch can be found (and deleted when the minimum moves) by searching for it.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.fx

__all__ = [
    "MIN_TORCH",
    "check_torch_version",
    "inductor_inference_passes",
    "onednn_linear_op",
    "parse_version",
    "source_guard",
    "source_name",
    "storage_unreadable_marker",
    "torch_at_least",
    "torch_version",
]

MIN_TORCH = (2, 11)
"""Oldest supported torch release, as (major, minor)."""

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """Return (major, minor, patch) from a version string such as '2.11.0a0+git1234'.

    Pre-release, dev and local suffixes are ignored, so a nightly counts as its release.
    """
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"cannot parse a torch version from {text!r}; expected 'X.Y.Z...'")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def torch_version() -> tuple[int, int, int]:
    """Return the installed torch version as (major, minor, patch)."""
    return parse_version(str(torch.__version__))


def torch_at_least(major: int, minor: int, patch: int = 0) -> bool:
    """Return True when the installed torch is at least ``major.minor.patch``."""
    return torch_version() >= (major, minor, patch)


def check_torch_version() -> None:
    """Raise ImportError when the installed torch is older than :data:`MIN_TORCH`."""
    if torch_at_least(*MIN_TORCH):
        return
    wanted = ".".join(str(part) for part in MIN_TORCH)
    raise ImportError(
        f"npugraph_ex needs torch >= {wanted}, found {torch.__version__}; "
        f'pip install "torch>={wanted}"'
    )


def source_name(source: Any) -> str:
    """The name of a Dynamo ``Source`` (``L['self'].eps``): a method in older releases, a
    property in newer ones."""
    name = source.name
    return name() if callable(name) else name


def source_guard(source: Any) -> Any:
    """The ``GuardSource`` of a Dynamo ``Source``, whichever of the two forms the release has."""
    guard = source.guard_source
    return guard() if callable(guard) else guard


def dynamo_cache_entries(code: Any) -> list[Any]:
    """Dynamo's compiled frames for a code object, the most recently compiled first; each has
    ``.code``, the rewritten bytecode."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return list(_debug_get_cache_entry_list(code))


def onednn_linear_op() -> Any:
    """oneDNN's linear kernel (``torch.ops.mkldnn._linear_pointwise.default``), or None in a
    torch build without oneDNN, which does not register it."""
    if not torch.backends.mkldnn.is_available():
        return None
    packet = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    return None if packet is None else packet.default


def storage_unreadable_marker() -> Any:
    """``fn(storage, message)`` making every tensor on ``storage`` raise ``message`` when its
    data is read, where this torch build has it (builds with CUDA; not CPU-only builds)."""
    mark = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
    if mark is None:
        return None
    return lambda storage, message: mark(storage._cdata, message)


def inductor_inference_passes(gm: torch.fx.GraphModule, device: torch.device) -> Any:
    """``gm`` after the graph passes Inductor runs on an inference graph before it lowers it
    (``compile_fx_forward``'s joint-graph passes: constant folding, no-op removal, its pattern
    rewrites), which ``compile_fx_inner`` alone skips. Releases differ in whether the passes
    take the inputs' device and whether they return the graph or rewrite it in place."""
    import inspect

    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    takes_device = "input_device" in inspect.signature(joint_graph_passes).parameters
    passed = joint_graph_passes(gm, input_device=device) if takes_device else joint_graph_passes(gm)
    return passed if isinstance(passed, torch.fx.GraphModule) else gm
