"""Names under which ``torch.compile`` finds the backend.

``backend="npugraph_ex"`` and ``backend="npugraph_ex_portable"`` come from the package's entry
points (group ``torch_dynamo_backends``), so they work without importing the package; Dynamo loads
them on first use. ``torch_npu`` may register ``npugraph_ex`` for its own backend; ours never
replaces it, and when the name is taken by another backend a warning says which one it means and
how to reach ours. Without installed entry points (a source checkout on ``sys.path``), importing
the package registers the second name itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from torch._dynamo.backends import registry

from npugraph_ex.debug.once import log_once

log = logging.getLogger(__name__)

NAME = "npugraph_ex"
PORTABLE_NAME = "npugraph_ex_portable"


def installed_entry_points() -> set[str]:
    return set(entry_points(group="torch_dynamo_backends").names)


def register_backends(backend: Callable[..., Any]) -> None:
    """Make ``npugraph_ex_portable`` resolvable; warn when ``npugraph_ex`` is not ours."""
    known = PORTABLE_NAME in registry._COMPILER_FNS or PORTABLE_NAME in installed_entry_points()
    if not known:
        registry.register_backend(compiler_fn=backend, name=PORTABLE_NAME)
    owner = registry._COMPILER_FNS.get(NAME)
    if owner is not None and owner is not backend:
        log_once(
            log,
            logging.WARNING,
            ("backend name taken", id(owner)),
            "backend='%s' is registered by %s, not by this package; use backend='%s' or "
            "backend=npugraph_ex.backend for this package's backend.",
            NAME,
            getattr(owner, "__module__", repr(owner)),
            PORTABLE_NAME,
        )
