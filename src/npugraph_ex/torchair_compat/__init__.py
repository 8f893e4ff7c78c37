"""TorchAir-style configuration, mapped onto the flat options of :class:`~.config.Config`.

A script written for TorchAir runs with only its import changed::

    config = CompilerConfig()
    config.mode = "npugraph_ex"
    config.debug.aclgraph.disable_mempool_reuse_in_same_fx = True
    backend = get_npu_backend(compiler_config=config)
    # same as options={"mode": "npugraph_ex", "reuse_graph_pool_in_same_fx": False}

``values`` holds TorchAir's option objects (``.value``), ``fields`` every field of TorchAir's tree
and what it does here, ``groups`` the config itself, ``backend`` the backend it builds.
"""

from __future__ import annotations

from npugraph_ex.torchair_compat.backend import (
    ConfiguredBackend,
    TorchAirPass,
    get_compiler,
    get_npu_backend,
)
from npugraph_ex.torchair_compat.groups import CompilerConfig, OptionGroup
from npugraph_ex.torchair_compat.values import OptionValue

__all__ = [
    "CompilerConfig",
    "ConfiguredBackend",
    "OptionGroup",
    "OptionValue",
    "TorchAirPass",
    "get_compiler",
    "get_npu_backend",
]
