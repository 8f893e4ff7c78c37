"""The pass manager: runs named passes in order and owns what cuts across them.

Per pass: skip it when its option is off or its name is in ``disabled_passes``; time it; check the
graph it leaves behind; write the graph after it to ``debug_dump_dir``; and name it in any error,
so a failure reads ``pass 'remove_noop_ops' failed: ...`` instead of a bare traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError, PassError

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

    def selected(self) -> list[GraphPass]:
        """The passes that will run under this config, in order."""
        disabled = set(self.config.disabled_passes)
        return [p for p in self.passes if p.enabled(self.config) and p.name not in disabled]

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> torch.fx.GraphModule:
        self.dump(gm, 0, "input")
        for number, graph_pass in enumerate(self.selected(), start=1):
            started = time.perf_counter()
            try:
                gm = graph_pass.run(gm, example_inputs, self.config) or gm
                gm.graph.lint()
                gm.recompile()
            except PassError:
                raise
            except Exception as error:
                raise PassError(graph_pass.name, f"{type(error).__name__}: {error}") from error
            self.seconds[graph_pass.name] = time.perf_counter() - started
            log.debug(
                "%s: pass %s took %.3f ms",
                self.graph_name,
                graph_pass.name,
                self.seconds[graph_pass.name] * 1e3,
            )
            self.dump(gm, number, f"after_{graph_pass.name}")
        return gm

    def dump(self, gm: torch.fx.GraphModule, number: int, label: str) -> None:
        if self.config.debug_dump_dir is None:
            return
        folder = Path(self.config.debug_dump_dir) / self.graph_name.replace("/", "_")
        folder.mkdir(parents=True, exist_ok=True)
        code = gm.print_readable(print_output=False, include_stride=True, include_device=True)
        (folder / f"{number:02d}_{label}.py").write_text(code)
