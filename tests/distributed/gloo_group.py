"""How every rank script of these tests joins its group: ``--rank R --world W --port P``."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal

import torch.distributed as dist


def join_gloo_group() -> tuple[int, int]:
    """Parse the rank flags and join the gloo group on localhost; (rank, world size)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # A rank the test stops for running too long first writes where every thread waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    return args.rank, args.world


def leave_gloo_group() -> None:
    """Wait for every rank (a barrier), then destroy the group: each rank's last collectives are
    done on every rank before any tears its connections down. A rank that destroyed its group
    while another was still in its last collectives aborted once at exit ("terminate called
    without an active exception", from a C++ worker thread)."""
    dist.barrier()
    dist.destroy_process_group()
