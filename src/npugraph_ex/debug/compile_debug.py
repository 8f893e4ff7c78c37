"""Where graph dumps go (``debug_dump_dir``, or torch's own debug folder under
``TORCH_COMPILE_DEBUG=1``), and what is written there besides the graph after each pass: the graph
that is captured, with the facts its capture manager keeps, and a summary of each captured key.

    <folder>/graph[0_0]/00_input.py ... 09_after_split_host_ints.py   (the pass manager)
    <folder>/graph[0_0]/captured.py                                   (build_graph_callable)
    <folder>/graph[0_0]/key0.json                                     (each capture)
    <folder>/graph[0_0]/debug.log                                     (compile_log)

``<folder>`` is ``debug_dump_dir`` when it is set; else, under ``TORCH_COMPILE_DEBUG=1``, the
``npugraph_ex`` folder of this process's run in torch's debug folder
(``torch_compile_debug/run_<time>-pid_<pid>/npugraph_ex``), next to ``torchdynamo`` and
``torchinductor``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx

from npugraph_ex.config import Config


def debug_folder(config: Config, graph_name: str) -> Path | None:
    """The folder of ``graph_name``'s debug files (made on first use), or None when off. A
    graph's second lowering for the kernel tier (``<graph>.kernels``) goes in the graph's folder,
    under ``kernels``."""
    if config.debug_dump_dir is not None:
        root = Path(config.debug_dump_dir)
    elif os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1":
        root = torch_debug_run() / "npugraph_ex"
    else:
        return None
    graph, _, lowering = graph_name.partition(".")
    folder = root / graph.replace("/", "_") / lowering
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@functools.cache
def torch_debug_run() -> Path:
    """This process's run folder in torch's debug folder: the one Dynamo opened, else a new one
    named as Dynamo names them."""
    from torch._dynamo import config as dynamo_config
    from torch._dynamo.utils import get_debug_dir

    opened = sorted(Path(dynamo_config.debug_dir_root).glob(f"run_*-pid_{os.getpid()}"))
    return opened[-1] if opened else Path(get_debug_dir())


def readable(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)


def write_captured_graph(folder: Path, gm: torch.fx.GraphModule, facts: Any, host: Any) -> None:
    """``captured.py``: the graph the capture manager captures, after every rewrite, headed by
    the facts it keeps about the graph and the ints it computes on the host."""
    header = [f"# {name}: {value!r}" for name, value in dataclasses.asdict(facts).items()]
    if host is not None:
        header.append(f"# host ints: {host!r}")
    (folder / "captured.py").write_text("\n".join([*header, "", readable(gm)]))


def write_capture_summary(folder: Path, label: str, graph: Any) -> None:
    """``key<N>.json``: one captured key's label, kernels, pool bytes and, where the runtime
    names them, the kernels a replay runs, in order."""
    summary = {
        "key": label,
        "kernels": graph.kernel_count,
        "pool_bytes": graph.pool_bytes,
        "steps": list(getattr(graph, "step_names", ())),
        "step_kinds": dict(getattr(graph, "step_kinds", {})),
    }
    name = label.split(":")[0]
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=1))


class Forward(logging.Handler):
    """Hands records at ``level`` or above to the handlers above ``logger``, as propagation
    would have with the logger at its own level."""

    def __init__(self, logger: logging.Logger, level: int):
        super().__init__(level)
        self.parent = logger.parent

    def emit(self, record: logging.LogRecord) -> None:
        if self.parent is not None:
            self.parent.handle(record)


@contextlib.contextmanager
def compile_log(folder: Path | None) -> Iterator[None]:
    """Every record of the ``npugraph_ex`` loggers, DEBUG included, appended to
    ``<folder>/debug.log`` while the block runs (a graph's compile); what reaches the
    application's own handlers is what it would have been without the file."""
    if folder is None:
        yield
        return
    logger = logging.getLogger("npugraph_ex")
    level, propagate = logger.level, logger.propagate
    handlers = [logging.FileHandler(folder / "debug.log")]
    handlers[0].setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if propagate:
        handlers.append(Forward(logger, logger.getEffectiveLevel()))
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.propagate = propagate
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
