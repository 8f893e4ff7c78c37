"""``npugraph-ex compare DUMP_A DUMP_B``: the first node where two tensor dumps differ."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXAMPLES = """\
examples:
  npugraph-ex compare dumps/original dumps/optimized     eager original graph against the replay
  npugraph-ex compare a/rank0/graph[0_0] b/rank0/graph[0_0] --atol 1e-3 --plot errors.png

A dump is a call folder (holding index.json) or a folder holding exactly one.
Exit status: 0 no divergence, 1 a divergence, 2 a dump that cannot be read.
"""

EXIT_SAME, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``compare`` on the ``npugraph-ex`` program's subparsers."""
    parser = subparsers.add_parser(
        "compare",
        help="the first node where two tensor dumps (dump_tensor_data) of one graph differ",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump_a", type=Path)
    parser.add_argument("dump_b", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the error here")
    parser.add_argument("--all", action="store_true", help="every compared node in the table")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from npugraph_ex.debug.dump_files import DumpError
    from npugraph_ex.tools.compare import compare_dumps, plot_errors

    try:
        comparison = compare_dumps(args.dump_a, args.dump_b, rtol=args.rtol, atol=args.atol)
        print(comparison.report(limit=None if args.all else 40))
        if args.plot is not None:
            print(f"wrote {plot_errors(comparison, args.plot)}")
    except DumpError as error:
        print(f"npugraph-ex compare: {error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_SAME if comparison.first_divergence is None else EXIT_DIFFERS
