"""One rank of the deadlock-check test: prints a JSON report.

    python deadlock_run.py --rank R --world W --port P

``same_order`` calls an all_reduce then an all_gather on every rank. ``crossed`` does so on rank
0 and the other way round elsewhere: run as is, each rank would wait in a collective the other
never calls. ``alone`` is compiled on rank 0 only, with the group's store timeout cut to 3 s:
its check waits for a rank that never comes. All are compiled with ``deadlock_check=True``.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import torch
import torch.distributed as dist
from gloo_group import join_gloo_group


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    rank, world = join_gloo_group()
    import npugraph_ex  # noqa: F401 - registers the backend

    messages = Messages()
    logger = logging.getLogger("npugraph_ex")
    logger.addHandler(messages)
    logger.setLevel(logging.INFO)

    def reduce_then_gather(y: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(y)
        out = torch.empty(world * y.shape[0], y.shape[1])
        dist.all_gather_into_tensor(out, y)
        return out

    def gather_then_reduce(y: torch.Tensor) -> torch.Tensor:
        out = torch.empty(world * y.shape[0], y.shape[1])
        dist.all_gather_into_tensor(out, y)
        dist.all_reduce(out)
        return out

    def same_order(x: torch.Tensor) -> torch.Tensor:
        return reduce_then_gather(x * 2)

    def crossed(x: torch.Tensor) -> torch.Tensor:
        return reduce_then_gather(x * 2) if rank == 0 else gather_then_reduce(x * 2)

    report = {}
    options = {"deadlock_check": True}
    with torch.no_grad():
        for fn in (same_order, crossed):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend="npugraph_ex", fullgraph=True, options=options)
            try:
                got = compiled(torch.ones(2, 4))
                report[fn.__name__] = {"ok": bool(torch.equal(got, fn(torch.ones(2, 4))))}
            except Exception as error:
                report[fn.__name__] = {"error": type(error).__name__, "message": str(error)}
    report["alone"] = "skipped"
    if rank == 0:
        dist.distributed_c10d._get_default_store().set_timeout(timedelta(seconds=3))
        torch._dynamo.reset()
        alone = torch.compile(same_order, backend="npugraph_ex", fullgraph=True, options=options)
        try:
            alone(torch.ones(2, 4))
            report["alone"] = "ran"
        except Exception as error:
            report["alone"] = {"error": type(error).__name__, "message": str(error)}
    report["log"] = [m for m in messages.messages if "deadlock_check" in m]
    dist.destroy_process_group()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
