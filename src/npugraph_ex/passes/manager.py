"""The pass manager: runs named passes in order and owns what cuts across them.

Per pass: skip it when its option is off or its name is in ``disabled_passes``; time it; check the
graph it leaves behind; write the graph after it to the debug folder (``debug_dump_dir``, or
torch's under ``TORCH_COMPILE_DEBUG=1``: ``debug.compile_debug``); and name it in any error,
so a failure reads ``pass 'remove_noop_ops' failed: ...`` instead of a bare traceback.

A pass that fails does not fail the compile: the graph goes on as it was before that pass (each
pass runs on a copy, so none is ever half-applied), one warning names the pass, the error, the
user's source line where the failure is tied to a node, and how to turn the pass off, and
``npugraph_ex.stats()`` counts it. ``strict_passes=True`` raises the ``PassError`` instead.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.debug.compile_debug import debug_folder, readable
from npugraph_ex.debug.dump import inherit_origins
from npugraph_ex.debug.source import source_line
from npugraph_ex.errors import ConfigError, DeadlockRiskError, PassError, ScopeError

log = logging.getLogger(__name__)

PassFn = Callable[[torch.fx.GraphModule, Sequence[Any], Config], "torch.fx.GraphModule | None"]
"""A pass: ``(gm, example_inputs, config)``; mutates ``gm`` or returns a replacement."""


def always(config: Config) -> bool:
    return True


@dataclass(frozen=True)
class GraphPass:
    name: str
    run: PassFn
    enabled: Callable[[Config], bool] = always
    """Whether the options turn this pass on."""


class PassManager:
    """Runs ``passes`` in order on a graph, under ``config``."""

    def __init__(self, passes: Sequence[GraphPass], config: Config, *, graph_name: str = "graph"):
        names = [p.name for p in passes]
        unknown = sorted(set(config.disabled_passes) - set(names))
        if unknown:
            raise ConfigError(
                f"disabled_passes names unknown passes {unknown} "
                f"(options={{'disabled_passes': {config.disabled_passes!r}}}); "
                f"valid pass names: {', '.join(names)}",
                option="disabled_passes",
            )
        self.passes = tuple(passes)
        self.config = config
        self.graph_name = graph_name
        self.seconds: dict[str, float] = {}
        self.failed: list[str] = []
        """Passes that raised, in order; the graph went on as it was before each of them."""

    def selected(self) -> list[GraphPass]:
        """The passes that will run under this config, in order."""
        disabled = set(self.config.disabled_passes)
        return [p for p in self.passes if p.enabled(self.config) and p.name not in disabled]

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        only: Collection[str] | None = None,
    ) -> torch.fx.GraphModule:
        """Run the selected passes in order (those named in ``only``, where given: a part of
        the pipeline); the graph after the last."""
        if only is None or self.passes[0].name in only:
            self.dump(gm, 0, "input")
        for number, graph_pass in enumerate(self.selected(), start=1):
            if only is not None and graph_pass.name not in only:
                continue
            started = time.perf_counter()
            before = copy_of(gm)
            nodes = len(gm.graph.nodes)
            try:
                gm = run_checked(graph_pass, gm, example_inputs, self.config)
                inherit_origins(before.graph, gm.graph)
            except PassError as error:
                if self.config.strict_passes:
                    raise
                self.failed.append(graph_pass.name)
                self.warn_failed(error)
                gm = before
            self.seconds[graph_pass.name] = time.perf_counter() - started
            log.debug(
                "%s: pass %s took %.3f ms, %d -> %d nodes",
                self.graph_name,
                graph_pass.name,
                self.seconds[graph_pass.name] * 1e3,
                nodes,
                len(gm.graph.nodes),
            )
            self.dump(gm, number, f"after_{graph_pass.name}")
        return gm

    def warn_failed(self, error: PassError) -> None:
        log.warning(
            "npugraph_ex: %s: %s%s. The graph goes on as it was before this pass. Turn the pass "
            "off with options={'disabled_passes': %r}, or raise instead with "
            "options={'strict_passes': True}.",
            self.graph_name,
            error,
            f" (at {error.source})" if error.source else "",
            [*self.config.disabled_passes, error.pass_name],
        )

    def dump(self, gm: torch.fx.GraphModule, number: int, label: str) -> None:
        folder = debug_folder(self.config, self.graph_name)
        if folder is not None:
            (folder / f"{number:02d}_{label}.py").write_text(readable(gm))


def run_checked(
    graph_pass: GraphPass, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config
) -> torch.fx.GraphModule:
    """Run one pass and check the graph it leaves; any failure becomes a ``PassError``."""
    try:
        gm = graph_pass.run(gm, example_inputs, config) or gm
        gm.graph.lint()
        gm.recompile()
    except (PassError, ScopeError, DeadlockRiskError):
        raise  # a pass error named already, or the user's graph refused with its fix
    except Exception as error:
        node = node_at_failure(error)
        raise PassError(
            graph_pass.name,
            f"{type(error).__name__}: {error}",
            source=source_line(node) if node is not None else None,
        ) from error
    return gm


def copy_of(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` that a pass on ``gm`` cannot change: new nodes with copies of their meta
    dicts (fake values shared, fx copies one level deep), the same attributes, the module meta."""
    graph = copy.deepcopy(gm.graph)
    graph.output_node().meta = dict(gm.graph.output_node().meta)
    copied = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    copied.meta = dict(gm.meta)
    return copied


def node_at_failure(error: BaseException) -> torch.fx.Node | None:
    """The graph node a failing pass was working on, where one of its frames names a ``node``
    that came from the user's code (the innermost such frame)."""
    frames = []
    trace = error.__traceback__
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in reversed(frames):
        node = frame.f_locals.get("node")
        if isinstance(node, torch.fx.Node) and node.meta.get("stack_trace"):
            return node
    return None
