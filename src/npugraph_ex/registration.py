"""Names under which ``torch.compile`` finds the backend.

``backend="npugraph_ex"`` comes from the package's entry point (group ``torch_dynamo_backends``),
so it works without importing the package. ``torch_npu`` may register the same name for its own
backend; ours never replaces it: the package registers a second name, and when ``npugraph_ex`` is
already taken by another backend a warning says which one it means.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch._dynamo.backends import registry

from npugraph_ex.debug.once import log_once

log = logging.getLogger(__name__)

NAME = "npugraph_ex"
PORTABLE_NAME = "npugraph_ex_portable"


def register_backends(backend: Callable[..., Any]) -> None:
    """Register ``backend`` as ``npugraph_ex_portable``; warn when ``npugraph_ex`` is not ours."""
    if PORTABLE_NAME not in registry._COMPILER_FNS:
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
