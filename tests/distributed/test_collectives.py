"""Collectives inside compiled graphs, captured and replayed on 2 real gloo ranks (processes),
and a tensor-parallel Qwen3 decode step built on them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

COLLECTIVES = Path(__file__).with_name("collective_run.py")
TP_DECODE = Path(__file__).with_name("tp_decode_run.py")
DEADLOCK = Path(__file__).with_name("deadlock_run.py")
WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path) -> list[dict[str, Any]]:
    """``script`` on every rank at once, a gloo group of ``WORLD`` processes; each rank's report."""
    port = str(free_port())
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                "--rank",
                str(rank),
                "--world",
                str(WORLD),
                "--port",
                port,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for rank in range(WORLD)
    ]
    deadline = time.monotonic() + 600
    try:
        done = [rank.communicate(timeout=max(deadline - time.monotonic(), 1)) for rank in ranks]
    except subprocess.TimeoutExpired:
        # A rank that waits in a collective another rank never reaches waits for gloo's own
        # timeout: stop them all and say what each printed, where each waited (the stacks
        # faulthandler writes on SIGUSR1, ``gloo_group``) and how it ended.
        for rank in ranks:
            if rank.poll() is None:
                rank.send_signal(signal.SIGUSR1)
        time.sleep(2)
        for rank in ranks:
            rank.kill()
        done = [rank.communicate() for rank in ranks]
        ended = [
            f"rank {index}: exit {rank.returncode}: stdout: {out[-1000:]}\nstderr: {err[-6000:]}"
            for index, (rank, (out, err)) in enumerate(zip(ranks, done, strict=True))
        ]
        pytest.fail("ranks still running after 600 s\n" + "\n".join(ended))
    # Every failed rank's error: the first to fail is often not rank 0 (the others then lose
    # their connection to it).
    failed = [
        f"rank {index}: {err[-3000:]}"
        for index, (rank, (_, err)) in enumerate(zip(ranks, done, strict=True))
        if rank.returncode != 0
    ]
    assert not failed, "\n".join(failed)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in done]


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    return run_ranks(COLLECTIVES)


CAPTURED = [
    "all_reduce",
    "all_reduce_max",
    "functional_all_reduce",
    "all_gather",
    "functional_all_gather",
    "reduce_scatter",
    "functional_reduce_scatter",
    "functional_broadcast",
    "all_reduce_on_a_stream",
    "reduce_beside_compute",
    "compute_after_a_reduce_block",
    "all_reduces_on_two_lanes",
]


@pytest.mark.parametrize("name", CAPTURED)
def test_a_collective_is_captured_and_every_replay_matches_eager(
    reports: list[dict[str, Any]], name: str
) -> None:
    for report in reports:
        assert report[name] == {
            "max_diff": 0.0, "graphs": 1, "captures": 1, "replays": 3, "eager_calls": 0,
        }  # fmt: skip


def test_c10d_broadcast_breaks_the_graph_and_both_sides_replay(
    reports: list[dict[str, Any]],
) -> None:
    for report in reports:
        result = report["broadcast"]
        assert result["max_diff"] == 0.0 and result["eager_calls"] == 0
        assert result["graphs"] == 2 and result["captures"] == 2 and result["replays"] == 6


def test_a_tensor_parallel_qwen3_decode_step_matches_the_whole_model() -> None:
    """Heads and MLP columns split over 2 ranks, an all_reduce after each row-parallel linear:
    every decode step is one replay, and the tokens are the unsplit model's. Two sequences as
    micro-batches whose all_reduces run on a stream block beside the other's compute decode
    each sequence's tokens too."""
    for report in run_ranks(TP_DECODE):
        assert report["tokens_equal"] and report["max_logit_diff"] < 1e-4
        assert (report["graphs"], report["captures"], report["replays"]) == (1, 1, 5)
        assert report["eager_calls"] == 0
        assert report["two_batch_tokens_equal"]
        assert report["two_batch"] == {"captures": 1, "replays": 5, "eager_calls": 0, "graphs": 1}


def test_a_collective_without_a_process_group_fails_as_in_eager() -> None:
    """No hang and no silent replay: the call fails with torch's own message, naming the fix."""

    def reduced(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        with torch.no_grad():
            torch.compile(reduced, backend="npugraph_ex")(torch.ones(2))


def line_in(script: Path, function: str, code: str) -> int:
    """The line number of ``code`` in ``function`` of ``script``."""
    lines = script.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if f"def {function}(" in line)
    return next(i for i in range(start, len(lines)) if lines[i].strip() == code) + 1


def test_deadlock_check_stops_crossed_collectives_before_they_hang() -> None:
    """Rank 0 reduces then gathers, rank 1 gathers then reduces: each rank fails at compile time,
    naming both calls where the model makes them; the same order passes and says so. A check no
    other rank reaches fails after the group's timeout, naming the ranks it waited for."""
    reports = run_ranks(DEADLOCK)
    for rank, report in enumerate(reports):
        other = 1 - rank
        assert report["same_order"] == {"ok": True}
        assert report["log"] == [
            "npugraph_ex: deadlock_check: graph[0/0]: 2 collectives in the same order on all 2 "
            "ranks: No deadlock risks detected"
        ]
        crossed = report["crossed"]
        assert crossed["error"] == "BackendCompilerFailed"
        reduce_at = line_in(DEADLOCK, "reduce_then_gather", "dist.all_reduce(y)")
        gather_at = line_in(DEADLOCK, "gather_then_reduce", "dist.all_gather_into_tensor(out, y)")
        calls = {
            0: "_c10d_functional.all_reduce.default(float32[2, 4], ['sum'], group 0) at File "
            f'"{DEADLOCK}", line {reduce_at}, in reduce_then_gather: dist.all_reduce(y)',
            1: "_c10d_functional.all_gather_into_tensor.default(float32[2, 4], [2], group 0) at "
            f'File "{DEADLOCK}", line {gather_at}, in gather_then_reduce: '
            "dist.all_gather_into_tensor(out, y)",
        }
        alone = report["alone"]
        if rank == 1:
            assert alone == "skipped"
        else:
            assert alone["error"] == "BackendCompilerFailed"
            assert (
                "DeadlockRiskError: deadlock_check: graph[0/0]: rank(s) [1] did not reach this "
                "graph's check within the process group's timeout (0:00:03): they compiled no "
                "graph with collectives at this point, or failed before it."
            ) in alone["message"]
        assert (
            f"DeadlockRiskError: deadlock_check: graph[0/0]: collective 0 differs between rank "
            f"{rank} and rank {other}: rank {rank} calls {calls[rank]}, rank {other} calls "
            f"{calls[other]}. Each would wait for a call the other never makes."
        ) in crossed["message"]
