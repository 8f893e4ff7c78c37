"""What each key of one optimised graph captures: one ``Program``, decided in one place.

    static_kernel_compile=True, chosen   -> Program(kernels, "kernels")   compiled for its sizes
    tensor dumps of replays wanted       -> Program(graph, "watched")     readable node by node
    few-row products at the key's sizes  -> Program(split run, "graph")   the CPU platform's split
    otherwise                            -> Program(graph, "graph")

A key whose kernels fail to compile captures the ATen graph instead, and says why once. With
the kernel tier in the background (``static_kernel_compile="background"``, the CPU default), a key
captures its ATen graph and is wrapped to swap compiled kernels in later (``tiered``). What each
key got is counted here (``counts``), and read by the graph's stats.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

from npugraph_ex.capture.tiers import TieredGraph
from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import first_line
from npugraph_ex.kernels.tier import KernelTier
from npugraph_ex.runtime.base import Capture, CapturedGraph, Program

log = logging.getLogger(__name__)


class KeyPrograms:
    """Builds the ``Program`` of each new key of one graph (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        config: Config,
        *,
        name: str,
        kernels: KernelTier | None = None,
        specialiser: Any = None,
        watched: bool = False,
    ):
        self.fn = fn
        self.name = name
        self.number = -1
        """Names this graph in messages said once (``name`` recurs after a Dynamo reset): its
        capture manager's number, set when the manager registers."""
        self.kernels = kernels
        """With ``static_kernel_compile``: the graph's kernel tier; synchronous (``True``): each
        chosen key's kernels compiled before its capture, else compiled while its ATen replay
        serves (``tiered``)."""
        self.specialiser = specialiser
        """For a graph whose products' row counts are symbolic: what a key with few rows runs
        instead of ``fn`` (the platform's key specialiser), or None."""
        self.watched = watched and kernels is None and isinstance(fn, torch.fx.GraphModule)
        """Whether captures keep every node's value, so that replays can be dumped."""
        self.capture_error_mode = config.capture_error_mode
        self.disabled_steps = frozenset(config.disabled_build_steps)
        self.counts: dict[str, Counter] = {
            "static_kernels": Counter(),
            "key_specialisation": Counter(),
        }
        """``static_kernels``: keys whose kernels were ``compiled``, loaded on a ``cache_hit``,
        ``reused``, ``failed`` to compile, or ``not chosen``; ``key_specialisation``: keys
        whose capture split few-row products (``specialised``) or where a split raised
        (``failed``)."""

    def program(self, fn: Callable[..., Any], kind: str = "graph") -> Program:
        return Program(fn, kind, self.capture_error_mode, self.disabled_steps)

    def for_key(self, args: Sequence[Any]) -> Program:
        """What a new key with inputs ``args`` captures."""
        if self.kernels is not None and self.kernels.synchronous:
            if self.kernels.wants(args):
                return self.compiled(args)
            self.counts["static_kernels"]["not chosen"] += 1
        if self.watched:
            return self.program(self.fn, "watched")
        return self.program(self.graph_for(args))

    def graph_for(self, args: Sequence[Any]) -> Callable[..., Any]:
        """What to run for ``args``' sizes: the graph with its few-row products split where the
        specialiser says so, else the graph as compiled (``force_eager`` runs this too)."""
        if self.specialiser is None:
            return self.fn
        specialised = self.specialiser.graph_for(args, self.counts["key_specialisation"])
        return self.fn if specialised is None else specialised

    def compiled(self, args: Sequence[Any]) -> Program:
        try:
            made, outcome = self.kernels.compile_now(args)
        except Exception as error:  # Inductor may fail on any op; the ATen graph still works
            self.counts["static_kernels"]["failed"] += 1
            log_once(
                log,
                logging.WARNING,
                ("static kernels", self.number, type(error).__name__),
                "npugraph_ex: %s: static_kernel_compile failed (%s: %s); this key captures the "
                "ATen graph instead",
                self.name,
                type(error).__name__,
                first_line(error),
            )
            return self.program(self.fn)
        self.counts["static_kernels"][outcome] += 1
        return self.program(made.run, "kernels")

    def tiered(
        self,
        graph: CapturedGraph,
        capture: Callable[[Program], Capture],
        args: Sequence[Any],
        kept: Sequence[int],
        written: Sequence[int],
    ) -> CapturedGraph:
        """A new key's graph: with background compiles, one that swaps in compiled kernels once
        they are ready, agree with it and are faster (``tiers``); else ``graph`` itself."""
        if self.kernels is None or self.kernels.synchronous:
            return graph
        self.kernels.prepare()
        return TieredGraph(
            graph, self.kernels, capture, args, kept, written, self.name, self.number
        )

    def reset_counts(self) -> None:
        for counter in self.counts.values():
            counter.clear()
