"""Two threads replay one compiled function at once, in a fresh process; reports as JSON.

``python threaded_replay_run.py``: the threads replay the two keys of one pool.
``python threaded_replay_run.py same-key``: both replay one key, with ``clone_output=True``
(each call must get its own results: input copies, replay and clones run under the pool's lock).
``python threaded_replay_run.py same-key-held``: the same without ``clone_output``: a replay
takes fresh memory for an output the other thread still holds (checked under the pool's lock).

Run by ``test_pools.py``. Dynamo itself is not thread-safe before torch 2.12 (pytorch#118260):
threads entering one compiled function race on its config patching and can leave the process's
Dynamo state changed (dynamic shapes on, resumed frames after a graph break left uncompiled),
which would leak into every later test. Prints one JSON line: the calls whose result differed
from eager (by row count) and the process's counters (``npugraph_ex.stats()["totals"]``).
"""

from __future__ import annotations

import json
import sys
import threading

import torch

import npugraph_ex

CALLS = 40
ROWS = (4, 64)


def expand(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = (x @ w).relu()
    return torch.cat([h, h.sigmoid()], dim=-1) * 2


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    mode = sys.argv[1] if len(sys.argv) > 1 else "two-keys"
    rows_per_thread = ROWS if mode == "two-keys" else (ROWS[0], ROWS[0])
    options = {"clone_output": mode == "same-key"}
    w = torch.randn(16, 32)
    fn = torch.compile(expand, backend="npugraph_ex", fullgraph=True, dynamic=True, options=options)
    for rows in set(rows_per_thread):  # every key captured up front, in one pool
        fn(torch.randn(rows, 16), w)
    npugraph_ex.reset_stats()
    failures: list[int] = []

    def run(rows: int) -> None:
        with torch.no_grad():
            for _ in range(CALLS):
                x = torch.randn(rows, 16)
                if not torch.equal(fn(x, w), expand(x, w)):
                    failures.append(rows)

    threads = [threading.Thread(target=run, args=(rows,)) for rows in rows_per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"failures": failures, **npugraph_ex.stats()["totals"]}))


if __name__ == "__main__":
    main()
