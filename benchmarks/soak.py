"""Does the CPU default stay right and flat for minutes under faults?

Two serving threads call one compiled tiny Qwen3 (the default: the kernel tier; `dynamic=True`,
no KV cache) with random lengths, more of them than `capture_limit` keys (the rest run eagerly);
every `--reload-every` calls the weights are reloaded, in place and through `.data` in turn;
at random times a compile process is killed. One call in `--check-every` is compared with eager
on the same weights (the reload waits for it). At the end: calls, wrong results, errors, compile
processes started, keys per state, resident memory and open file descriptors after the warm-up
and at the end, and resident memory at each minute between.

    python benchmarks/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

LENGTHS = range(2, 13)
"""Eleven lengths, past the capture limit below: some keys are captured, the rest run eagerly."""
CAPTURE_LIMIT = 6


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        import transformers

        from npugraph_ex.bench.presets import qwen3_config

        torch.manual_seed(0)
        self.args = args
        self.model = transformers.AutoModelForCausalLM.from_config(qwen3_config("tiny")).eval()
        self.fn = torch.compile(
            lambda ids: self.model(ids, use_cache=False).logits,
            backend="npugraph_ex",
            dynamic=True,
            options={"capture_limit": CAPTURE_LIMIT, "background_compile_after": 4},
        )
        self.weights = threading.Lock()
        """Held by a checked call and by a reload: a checked call sees one set of weights."""
        self.counts = {"calls": 0, "checked": 0, "wrong": 0, "errors": 0, "reloads": 0}
        self.counts_lock = threading.Lock()
        self.errors: list[str] = []
        self.workers: set[int] = set()
        self.stop = threading.Event()

    def ids(self, rng: random.Random) -> torch.Tensor:
        length = rng.choice(LENGTHS)
        return torch.tensor([[rng.randrange(self.model.config.vocab_size) for _ in range(length)]])

    def serve(self, seed: int) -> None:
        rng = random.Random(seed)
        with torch.no_grad():
            while not self.stop.is_set():
                ids = self.ids(rng)
                checked = rng.randrange(self.args.check_every) == 0
                try:
                    if checked:
                        with self.weights:
                            got = self.fn(ids).clone()
                            want = self.model(ids, use_cache=False).logits
                        right = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
                    else:
                        self.fn(ids)
                        right = True
                except Exception as error:  # counted and reported, the soak goes on
                    self.count("errors")
                    self.errors.append(f"{type(error).__name__}: {error}"[:300])
                    continue
                self.count("calls")
                if checked:
                    self.count("checked")
                    if not right:
                        self.count("wrong")

    def count(self, name: str) -> None:
        with self.counts_lock:
            self.counts[name] += 1

    def reload(self, through_data: bool) -> None:
        """New weights, as a training step or a checkpoint load would give them."""
        with self.weights, torch.no_grad():
            for parameter in self.model.parameters():
                if through_data:
                    parameter.data = parameter.data * 0.999
                else:
                    parameter.mul_(1.001)
        self.count("reloads")

    def faults(self, rng: random.Random) -> None:
        """Reload the weights every ``--reload-every`` calls; kill a compile process now and
        then."""
        from npugraph_ex.kernels.processes import PROCESSES

        reloaded_at = 0
        while not self.stop.wait(0.05):
            self.workers |= {p.process.pid for p in PROCESSES.processes}
            calls = self.counts["calls"]
            if calls - reloaded_at >= self.args.reload_every:
                reloaded_at = calls
                self.reload(through_data=self.counts["reloads"] % 2 == 1)
            if PROCESSES.processes and rng.random() < self.args.kill_chance:
                os.kill(rng.choice(PROCESSES.processes).process.pid, 9)

    def run(self) -> dict[str, Any]:
        import npugraph_ex

        threads = [threading.Thread(target=self.serve, args=(seed,)) for seed in (1, 2)]
        for thread in threads:
            thread.start()
        time.sleep(self.args.warmup_s)
        start = {"resident_mib": round(resident_mib(), 1), "descriptors": open_descriptors()}
        fault_thread = threading.Thread(target=self.faults, args=(random.Random(3),))
        fault_thread.start()
        minutes = []
        deadline = time.monotonic() + self.args.minutes * 60
        while not self.stop.wait(max(0.0, min(60.0, deadline - time.monotonic()))):
            minutes.append(round(resident_mib(), 1))
            if time.monotonic() >= deadline:
                self.stop.set()
        for thread in [*threads, fault_thread]:
            thread.join()
        end = {"resident_mib": round(resident_mib(), 1), "descriptors": open_descriptors()}
        from npugraph_ex.kernels.processes import PROCESSES

        states: dict[str, int] = {}
        reasons: dict[str, int] = {}
        for graph in npugraph_ex.stats()["graphs"]:
            for state, count in graph.get("background", {}).items():
                states[state] = states.get(state, 0) + count
            for key in graph.get("keys", {}).values():
                reason = key.get("kernel_tier", "")
                reasons[reason] = reasons.get(reason, 0) + 1
        return {
            **self.counts,
            "compile_processes_seen": len(self.workers),
            "key_states": states,
            "why_keys_are_not_on_kernels": reasons,
            "compiles_in_flight_at_end": PROCESSES.in_flight,
            "after_warmup": start,
            "end": end,
            "resident_mib_each_minute": minutes,
            "errors_seen": sorted(set(self.errors))[:5],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--reload-every", type=int, default=300)
    parser.add_argument("--check-every", type=int, default=20)
    parser.add_argument("--kill-chance", type=float, default=0.002, help="per 50 ms tick")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from common import environment, environment_line

    report = Soak(args).run()
    print(json.dumps(report, indent=1))
    print(environment_line(environment()))


if __name__ == "__main__":
    main()
