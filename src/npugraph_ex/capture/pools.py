"""Which memory pool each new key of one graph captures into (DESIGN: one pool per FX graph)."""

from __future__ import annotations

from typing import Any

from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError
from npugraph_ex.runtime.base import DeviceRuntime

KEPT_POOLS: dict[tuple[str, Any], Any] = {}
"""Holds of the handles given through ``use_graph_pool``, for the process's life: a handle may
outlive every graph compiled with it and then be given to the next."""


class PoolPolicy:
    """Which memory pool each new key's capture draws from (DESIGN: one pool per FX graph).

    ``use_graph_pool`` given: that handle, for every key of every graph compiled with it. Else
    ``reuse_graph_pool_in_same_fx``: one pool for all keys of this graph. Else a pool per key.
    A shared pool is held (``DeviceRuntime.hold_pool``) from its first capture on, so that
    releasing its keys (a recapture, freed parameters, a model deleted) never leaves a later
    capture a pool the device's allocator forgot.
    """

    def __init__(self, config: Config, runtime: DeviceRuntime):
        handle = config.use_graph_pool
        if handle is not None and not runtime.accepts_pool(handle):
            raise ConfigError(
                f"use_graph_pool must be a pool handle for {runtime.name} graphs, got "
                f"{handle!r}; make one with npugraph_ex.graph_pool_handle({runtime.name!r})",
                option="use_graph_pool",
            )
        self.runtime = runtime
        self.shared = handle
        self.given = handle is not None
        self.per_key = handle is None and not config.reuse_graph_pool_in_same_fx
        self.hold: Any = None
        self.held = False

    def for_new_key(self) -> Any:
        if self.per_key:
            return self.runtime.new_pool()
        if self.shared is None:
            self.shared = self.runtime.new_pool()
        if not self.held:
            self.hold_shared()
        return self.shared

    def hold_shared(self) -> None:
        self.held = True
        if not self.given:
            self.hold = self.runtime.hold_pool(self.shared)
            return
        key = (self.runtime.name, self.shared)
        if key not in KEPT_POOLS and (hold := self.runtime.hold_pool(self.shared)) is not None:
            KEPT_POOLS[key] = hold
