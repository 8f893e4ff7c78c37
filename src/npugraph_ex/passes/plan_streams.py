"""Plan where each lane waits for a stream block, so blocks run beside the main path.

    before:  scope_enter([stream], ["comm"]); %ar = all_reduce(%y); %w = wait_tensor(%ar)
             scope_exit(); %h = mm(%x, %w1); %o = add(%h, %w)
    after:   scope_enter([stream], ["comm"]); %ar = all_reduce(%y); %w = wait_tensor(%ar)
             scope_exit(); %h = mm(%x, %w1)                 <- runs while the block runs
             stream_join(0, [%y, %ar, %w]); %o = add(%h, %w)

First, TorchAir's ``*_on_stream`` ops (a custom pass may have inserted them) become tagged
events on the lanes of the streams they name (``stream_syncs``), and blocks opened inside other
blocks are split into blocks side by side
(``unnest_blocks``; the regions PyTorch's own stream contexts left in the graph became blocks in
the ``native_streams`` pass, the first of all). Then a node waits for an earlier block of another
lane (a ``stream_join`` inserted before it) when it
- reads memory the block writes or produces,
- writes memory the block reads or writes (storages, so views count),
- calls a collective of a process group the block calls too: collectives of one group are issued
  in program order on every rank, or two ranks could pair them differently,
- waits on a tagged event whose latest record is in the block (``npu_wait_tensor``'s dependency
  is a read, so it needs nothing more),
- is TorchAir's ``wait([r, ...])`` and the block computes one of the nodes it lists (a ``record()``
  a custom pass inserted has no fake value to find its memory by).

``record_tagged_stream`` neither reads nor writes for this plan: it never waits.

A tag's blocks run one after another on its lane and never wait for each other. The graph's
output waits for every block not joined yet: a block never outlives its call. A join inside
another block makes that block wait for the joined one; the joined block's tensors are then kept
until the main path joins the waiting one. Runtimes read the plan from the graph: the CPU engine
runs each tag's blocks on a worker thread, CUDA and NPU on a side stream per tag; with the pass
off (``disabled_passes``) or failed, blocks run in program order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from npugraph_ex.config import Config
from npugraph_ex.passes.stream_blocks import (
    Block,
    Lanes,
    collective_group,
    find_lanes,
    has_stream_blocks,
    storages,
    tensor_args,
    written_args,
)
from npugraph_ex.passes.stream_syncs import lower_on_stream_ops
from npugraph_ex.passes.stream_waits import check_event_order, tag_of
from npugraph_ex.passes.unnest_blocks import unnest_blocks
from npugraph_ex.scope.events import EVENT_RECORD, EVENT_WAIT, KEEPS_FOR_TAG, STREAM_JOIN, WAIT
from npugraph_ex.scope.ops import is_scope_marker


def plan_streams(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config) -> None:
    graph = gm.graph
    lower_on_stream_ops(graph)  # after the user's passes, which may have inserted them
    if not has_stream_blocks(graph):
        return
    unnest_blocks(graph)
    lanes = find_lanes(graph)
    check_event_order(graph, lanes)
    JoinPlanner(graph, lanes).run()


class JoinPlanner:
    def __init__(self, graph: torch.fx.Graph, lanes: Lanes):
        self.graph = graph
        self.lanes = lanes
        self.pending: list[Block] = []
        """Blocks closed and not yet joined by the main path, in program order."""
        self.latest_record: dict[str, Block | None] = {}

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op == "output":
                unclosed = self.lanes.block_of[node]  # a block a custom pass left open
                if unclosed is not None:
                    self.pending.append(unclosed)
                self.join(self.pending, node, None)
                return
            block = self.lanes.block_of[node]
            if node in self.lanes.closes:
                self.pending.append(self.lanes.closes[node])
            if (
                node.op != "call_function"
                or is_scope_marker(node.target)
                or node.target in KEEPS_FOR_TAG
            ):
                continue
            lane = None if block is None else block.tag
            others = [b for b in self.pending if b.tag != lane]
            earlier = self.blocks_to_wait_for(node, others) if others else []
            self.join(earlier, node, block)
            if node.target is EVENT_RECORD:
                self.latest_record[tag_of(node)] = block
            if block is not None:
                block.add(node)

    def blocks_to_wait_for(self, node: torch.fx.Node, blocks: list[Block]) -> list[Block]:
        """Those of ``blocks`` that ``node`` must wait for (the rules above)."""
        reads = set().union(*(storages(arg) for arg in tensor_args(node)))
        writes = set().union(*(storages(arg) for arg in written_args(node)))
        group = collective_group(node)
        recorded = self.latest_record.get(tag_of(node)) if node.target is EVENT_WAIT else None
        listed = (
            {self.lanes.block_of[n] for n in node.all_input_nodes} if node.target is WAIT else ()
        )
        return [
            block
            for block in blocks
            if reads & block.writes
            or writes & (block.reads | block.writes)
            or group in block.groups
            or block is recorded
            or block in listed
        ]

    def join(self, blocks: list[Block], before: torch.fx.Node, waiting: Block | None) -> None:
        """Insert a join of each of ``blocks`` before ``before``, on the lane of ``waiting``."""
        for block in list(blocks):
            with self.graph.inserting_before(before):
                joined = self.graph.call_function(STREAM_JOIN, (block.index, list(block.touched)))
            joined.meta["stack_trace"] = before.meta.get("stack_trace")
            if waiting is None:
                self.pending.remove(block)
            else:
                waiting.touched.update(block.touched)
