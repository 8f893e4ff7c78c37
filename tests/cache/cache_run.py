"""Runs a model through ``npugraph_ex.inference.cache_compile`` in a fresh process; prints JSON.

Run by the compile cache tests, usually twice on one cache folder: the first process compiles
and stores, the second should load. The model comes from ``user_model.py`` in ``--model-dir``
(written by the test, so a test can edit the method's source between runs): a ``Model`` whose
``forward(x)`` writes a running sum into a buffer in place, built by ``make()``.

The report: the method's ``cache_info()``, how many graphs Dynamo traced in this process, the
largest differences from eager (outputs, and the buffer written in place) and the warnings.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import sys

import torch


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--dtype", default="float32", help="of the model and its inputs")
    parser.add_argument("--shapes", default="3x16,5x16,3x16")
    parser.add_argument("--static", action="store_true")
    parser.add_argument(
        "--delete-after", type=int, default=0, help="delete the cache folder after this many calls"
    )
    args = parser.parse_args()
    sys.path.insert(0, args.model_dir)
    warnings = Warnings()
    logging.getLogger("npugraph_ex").addHandler(warnings)

    from user_model import make  # noqa: PLC0415 - written by the test

    import npugraph_ex.inference

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = make().eval().to(dtype)
    reference = copy.deepcopy(model)
    cached = npugraph_ex.inference.cache_compile(
        model.forward,
        cache_dir=args.cache_dir,
        dynamic=not args.static,
        options=json.loads(args.options),
    )
    output_diffs = []
    with torch.no_grad():
        for number, shape in enumerate(args.shapes.split(","), 1):
            x = torch.randn(*[int(n) for n in shape.split("x")]).to(dtype)
            output_diffs.append(float((cached(x) - reference(x)).abs().max()))
            if number == args.delete_after:
                shutil.rmtree(args.cache_dir)
    from torch._dynamo.utils import counters

    report = {
        "info": cached.cache_info(),
        "traced": counters["stats"]["unique_graphs"],
        "max_output_diff": max(output_diffs),
        "buffer_diff": float((model.total - reference.total).abs().max()),
        "warnings": warnings.messages,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
