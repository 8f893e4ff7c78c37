"""Calls whose tensors are dumped (``dump_tensor_data`` on the optimised graph): the routing
around a capture manager.

A dumped call replays its key, read after each node's kernels (a new key is captured first, its
effects undone), where the runtime can read a replay that way; else the graph runs node by node.
Calls that are not dumped go straight to the manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npugraph_ex.capture import inputs as io
from npugraph_ex.capture.manager import CapturedKey, CaptureManager
from npugraph_ex.debug.dump import CallDump, TensorDumper, say_dumps_run_eagerly
from npugraph_ex.runtime.base import as_output_list


class DumpedCalls:
    """The manager's calls, with the ones ``dumper`` selects dumped."""

    def __init__(self, manager: CaptureManager, dumper: TensorDumper):
        self.manager = manager
        self.dumper = dumper

    def __call__(self, args: list[Any]) -> list[Any]:
        dump = self.dumper.next_call()
        if dump is None:
            return self.manager(args)
        try:
            return self.dumped(args, dump)
        finally:
            dump.finish()

    def dumped(self, args: list[Any], dump: CallDump) -> list[Any]:
        manager = self.manager
        reason = self.why_replays_cannot_be_dumped()
        if reason is None:
            entry = self.replayable(args)
            if entry is None:
                saved = io.snapshot(args, manager.layout.mutated, manager.facts.draws_random)
                manager(args)  # captures the key as any first call would
                io.restore(saved)
                entry = self.replayable(args)
            if entry is not None:
                dump.begin(entry.label.split(":")[0], "replay", manager.fn.graph)
                return manager.replay(entry, args, visit=dump.visit)
            reason = "this call's key is not captured"
        say_dumps_run_eagerly(manager.stats.name, reason, manager.number)
        manager.stats.ran_eagerly("dumped")
        return as_output_list(dump.run_graph(manager.fn, args, "eager"))

    def replayable(self, args: Sequence[Any]) -> CapturedKey | None:
        """The captured key this call would replay, or None."""
        manager = self.manager
        entry = manager.entries.get(manager.layout.key_of(args))
        if entry is None or manager.config.force_recapture:
            return None
        if manager.layout.mutated_addresses(args) != entry.staged.mutated_addresses:
            return None
        return entry

    def why_replays_cannot_be_dumped(self) -> str | None:
        manager = self.manager
        if manager.config.force_eager:
            return "force_eager"
        if manager.blocker is not None:
            return manager.blocker
        if manager.programs.kernels is not None:
            return "static kernels cannot be read between kernels"
        if not manager.programs.watched:
            return f"{manager.runtime.name} graphs cannot be read between kernels"
        return None
