"""The ``npugraph-ex`` command line program: one subcommand per module.

    npugraph-ex bench [--model PRESET|CHECKPOINT] [--dtype float32|float16|bfloat16] [--peers] ...
    npugraph-ex cache list|show|clear [PATH]
    npugraph-ex compare DUMP_A DUMP_B [--plot OUT.png]
    npugraph-ex bisect FILE.py:FUNCTION

Each subcommand's module provides ``add_parser(subparsers)``, which registers its flags and
sets ``run`` (called with the parsed arguments; returns the exit status) as a default. This
module only assembles them, so a subcommand is added by adding one line to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from npugraph_ex.bench import command as bench_command
from npugraph_ex.cache import command as cache_command
from npugraph_ex.tools import bisect_command, compare_command

PROG = "npugraph-ex"

SUBCOMMANDS = (
    bench_command.add_parser,
    cache_command.add_parser,
    compare_command.add_parser,
    bisect_command.add_parser,
)
"""Each registers one subcommand on the program's subparsers."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="npugraph_ex tools: a torch.compile backend that captures a graph once per "
        "input shape and replays it.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="command", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: this process's arguments) and run the chosen subcommand."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    args.argv = arguments
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
