"""``npugraph-ex cache list|show|clear [PATH]``: look into and empty the compile cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from npugraph_ex.cache.readable import clear_entries, list_entries, readable_entries
from npugraph_ex.errors import NpuGraphExError

EXAMPLES = """\
examples:
  npugraph-ex cache list                     entries under $NPUGRAPH_EX_CACHE_HOME, else
                                             $TORCHAIR_CACHE_HOME (default ./.npugraph_ex_cache)
  npugraph-ex cache show .npugraph_ex_cache  key, guards, graphs and bytecode of each entry
  npugraph-ex cache clear /srv/model-cache   remove every entry under that folder
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``cache`` on the ``npugraph-ex`` program's subparsers."""
    parser = subparsers.add_parser(
        "cache",
        help="list, show or clear compile cache entries (npugraph_ex.inference.cache_compile)",
        description="The compile cache written by npugraph_ex.inference.cache_compile.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("list", "show", "clear"))
    parser.add_argument(
        "path",
        nargs="?",
        type=Path,
        default=None,
        help="a cache folder, or one cache file for show (default: the default cache folder)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from npugraph_ex.inference import default_cache_dir

    path = args.path if args.path is not None else default_cache_dir()
    try:
        if args.action == "list":
            print(list_entries(path))
        elif args.action == "show":
            print(readable_entries(path))
        else:
            removed = clear_entries(path)
            for folder in removed:
                print(f"removed {folder}")
            print(f"{len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'} removed")
    except NpuGraphExError as error:
        print(f"npugraph-ex cache: {error}")
        return 2
    return 0
