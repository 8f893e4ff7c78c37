"""One rank of the collective tests: compiles functions that call ``torch.distributed``, checks
their replays against eager, prints a JSON report.

    python collective_run.py --rank R --world W --port P

Each function runs ``CALLS`` times with new inputs, compiled (``fullgraph=True`` but for
``GRAPH_BREAKS``: a graph break is a failure) and then eagerly, in that order on every rank, so
that the collectives pair up.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from gloo_group import join_gloo_group, leave_gloo_group

from npugraph_ex.scope import stream

CALLS = 4

GRAPH_BREAKS = frozenset({"broadcast"})
"""``dist.broadcast`` is not among the c10d calls Dynamo rewrites to functional collectives
(torch 2.11 to 2.13): it breaks the graph, and the graphs around it are captured."""


def cases(world: int, weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    group = dist.group.WORLD

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        dist.all_reduce(y)
        return y.relu() + 1

    def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        return y * 2

    def functional_all_reduce(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x @ weight, "sum", group).relu() + 1

    def all_gather(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        out = torch.empty(world * y.shape[0], y.shape[1])
        dist.all_gather_into_tensor(out, y)
        return out * 2

    def functional_all_gather(x: torch.Tensor) -> torch.Tensor:
        return fc.all_gather_tensor(x @ weight, 0, group) * 2

    def reduce_scatter(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        out = torch.empty(y.shape[0] // world, y.shape[1])
        dist.reduce_scatter_tensor(out, y)
        return out + 1

    def functional_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
        return fc.reduce_scatter_tensor(x @ weight, "sum", 0, group) + 1

    def broadcast(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        dist.broadcast(y, src=0)
        return y - 1

    def functional_broadcast(x: torch.Tensor) -> torch.Tensor:
        return fc.broadcast(x @ weight, 0, group) - 1

    def all_reduce_on_a_stream(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        with stream("comm"):
            dist.all_reduce(y)
        z = (x * 3) @ weight  # runs while the block reduces
        return y.relu() + z

    def reduce_beside_compute(x: torch.Tensor) -> torch.Tensor:
        with stream("comm"):  # computes too: the block runs on the worker of "comm"
            y = (x @ weight).relu()
            dist.all_reduce(y)
        return y + x.sin()

    def compute_after_a_reduce_block(x: torch.Tensor) -> torch.Tensor:
        y = x @ weight
        with stream("comm"):  # collectives only: issued in place
            dist.all_reduce(y)
        with stream("side"):  # a worker block that reads the reduced y: waits for it
            z = y.relu() * 2
        return z + x.sin()

    def all_reduces_on_two_lanes(x: torch.Tensor) -> torch.Tensor:
        y, z = x @ weight, x @ weight.T
        with stream("comm"):
            dist.all_reduce(y)
        dist.all_reduce(z)  # same group: issued after the block's, on every rank
        return y * z

    return {fn.__name__: fn for fn in (
        all_reduce, all_reduce_max, functional_all_reduce, all_gather, functional_all_gather,
        reduce_scatter, functional_reduce_scatter, broadcast, functional_broadcast,
        all_reduce_on_a_stream, reduce_beside_compute, compute_after_a_reduce_block,
        all_reduces_on_two_lanes,
    )}  # fmt: skip


def main() -> None:
    rank, world = join_gloo_group()
    import npugraph_ex

    torch.manual_seed(rank)
    weight = torch.randn(8, 8)
    report = {}
    with torch.no_grad():
        for name, fn in cases(world, weight).items():
            npugraph_ex.reset_stats()
            torch._dynamo.reset()
            fullgraph = name not in GRAPH_BREAKS
            compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=fullgraph)
            diffs = []
            for call in range(CALLS):
                x = torch.randn(4, 8) + call
                got = compiled(x).clone()
                diffs.append(float((got - fn(x)).abs().max()))
            graphs = [g for g in npugraph_ex.stats()["graphs"] if g["captures"] or g["eager_calls"]]
            report[name] = {
                "max_diff": max(diffs),
                "graphs": len(graphs),
                "captures": sum(g["captures"] for g in graphs),
                "replays": sum(g["replays"] for g in graphs),
                "eager_calls": sum(sum(g["eager_calls"].values()) for g in graphs),
            }
    leave_gloo_group()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
