"""An optimised FX graph as bytes and back: how the compile cache stores a graph, and how a
background compile hands one to its worker process. Node meta is kept only where it is plain data
(``KEPT_META``): fake values are remade by whoever traces the graph again."""

from __future__ import annotations

import torch.fx

from npugraph_ex.debug.dump import ORIGIN
from npugraph_ex.passes.manager import copy_of

KEPT_META = ("stack_trace", ORIGIN)
"""Node meta kept in a stored graph: source lines, for messages, and origins, for dumps."""


def pickle_graph(gm: torch.fx.GraphModule) -> bytes:
    """``gm`` pickled with the node meta in ``KEPT_META`` only."""
    from torch.fx._graph_pickler import GraphPickler, Options

    stored = copy_of(gm)
    stored.meta = {}
    for node in stored.graph.nodes:
        node.meta = {k: v for k, v in node.meta.items() if k in KEPT_META}
    return GraphPickler.dumps(stored, Options(ops_filter=None))


def load_graph(data: bytes) -> torch.fx.GraphModule:
    """A stored graph, ready to run."""
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    gm = GraphPickler.loads(data, FakeTensorMode())  # no fake values to remake in it
    gm.recompile()
    return gm
