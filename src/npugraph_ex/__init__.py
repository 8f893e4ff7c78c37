"""npugraph_ex: a ``torch.compile`` backend that captures a graph once per shape and replays it.

    opt = torch.compile(model, backend="npugraph_ex", fullgraph=True, dynamic=True,
                        options={"capture_limit": 256})

Importing the package registers the backend (under ``npugraph_ex_portable``; ``npugraph_ex`` comes
from the package's entry point) and the two graph ops of ``npugraph_ex.scope``, and does nothing
else. ``npugraph_ex.inference`` (the compile cache) is reachable from here, as
``torchair.inference`` is.

The modules form layers, top to bottom. A module imports its own layer and those below it, never
one above (``tests/test_layers.py`` reads every import):

1. ``cli``, ``tools/``, ``bench/``: what a user runs (``npugraph-ex``, bisect, compare, bench).
2. ``inference``, ``cache/``, ``__init__``: the compile cache, and this package, which reaches it.
3. ``torchair_compat/``, ``dynamo_backend``, ``registration``, ``model_floats``: the backends
   ``torch.compile`` finds and calls, and a model's Python floats made constants of its graph.
4. ``compiler``: an AOT graph through the passes, then a capture manager on its device runtime.
5. ``capture/``, ``kernels/``: what each graph key captures, and its static kernels.
6. ``passes/``: graph rewrites, one a file, in the order ``passes/pipeline.py`` writes once.
7. ``runtime/``: each device's capture and replay.
8. ``scope/``, ``ops``, ``debug/``: stream and core scopes and their ops; leaf debugging helpers.
9. ``config``, ``option_checks``, ``errors``, ``compat``, ``schemas``, ``fixed_views``,
   ``process_state``: what every layer may read (the last lists the state kept for the whole
   process, and why).
"""

from __future__ import annotations

import logging

from npugraph_ex.compat import check_torch_version

check_torch_version()

from npugraph_ex import inference, ops, scope  # noqa: E402
from npugraph_ex.capture.stats import reset_stats, stats  # noqa: E402
from npugraph_ex.compiler import compile_fx  # noqa: E402
from npugraph_ex.config import Config  # noqa: E402
from npugraph_ex.dynamo_backend import npugraph_ex_backend  # noqa: E402
from npugraph_ex.passes.patterns import register_replacement  # noqa: E402
from npugraph_ex.registration import register_backends  # noqa: E402
from npugraph_ex.runtime import graph_pool_handle  # noqa: E402
from npugraph_ex.torchair_compat import CompilerConfig, get_compiler, get_npu_backend  # noqa: E402

backend = npugraph_ex_backend
"""The backend callable: ``torch.compile(model, backend=npugraph_ex.backend)``."""

logger = logging.getLogger("npugraph_ex")
"""The root of the package's loggers (``torchair.logger`` in TorchAir's scripts):
``npugraph_ex.logger.setLevel(logging.DEBUG)``."""

register_backends(npugraph_ex_backend)

__version__ = "0.1.0"

__all__ = [
    "CompilerConfig",
    "Config",
    "backend",
    "compile_fx",
    "get_compiler",
    "get_npu_backend",
    "graph_pool_handle",
    "inference",
    "logger",
    "npugraph_ex_backend",
    "ops",
    "register_replacement",
    "reset_stats",
    "scope",
    "stats",
]
