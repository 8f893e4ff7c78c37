"""``npugraph-ex bisect FILE.py:FUNCTION``: ``npugraph_ex.tools.bisect`` from the command line.

``FUNCTION()`` (no arguments) returns ``(fn, args)``, ``(fn, args, kwargs)`` or
``(fn, args, kwargs, options)``: the function whose result is wrong, what to call it with and the
npugraph_ex options it was compiled with.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

EXAMPLES = """\
examples:
  npugraph-ex bisect repro.py:make                       the layer and node that change make()'s fn
  npugraph-ex bisect repro.py:make --options '{"remove_cat_ops": false}' --no-static-kernels
"""

EXIT_SAME, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bisect`` on the ``npugraph-ex`` program's subparsers."""
    parser = subparsers.add_parser(
        "bisect",
        help="find the layer (Dynamo/AOTAutograd, a pass, capture/replay, static kernels) and "
        "the node that change a function's result",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="FILE.py:FUNCTION, FUNCTION() returning (fn, args, ...)")
    parser.add_argument("--options", type=json.loads, default=None, help="options, as JSON")
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--no-static-kernels", action="store_true", help="skip that trial")
    parser.add_argument("--dump-dir", type=Path, default=None, help="keep the dumps here")
    parser.set_defaults(run=run)
    return parser


def load_target(target: str) -> tuple[Any, tuple, dict, dict | None]:
    """``FILE.py:FUNCTION`` called: the function under test, its args, kwargs and options."""
    path, _, name = target.rpartition(":")
    if not path or not name:
        raise ValueError(f"{target!r}: write the target as FILE.py:FUNCTION")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    spec.loader.exec_module(module)
    make = getattr(module, name, None)
    if not callable(make):
        raise ValueError(f"{file} has no function {name!r}")
    made = make()
    if not isinstance(made, tuple) or not 2 <= len(made) <= 4:
        raise ValueError(
            f"{name}() must return (fn, args[, kwargs[, options]]), got {made!r}"[:300]
        )
    fn, call_args, *rest = made
    kwargs = rest[0] if rest else {}
    options = rest[1] if len(rest) > 1 else None
    return fn, tuple(call_args), dict(kwargs or {}), options


def run(args: argparse.Namespace) -> int:
    from npugraph_ex.tools.bisection import bisect

    try:
        fn, call_args, kwargs, options = load_target(args.target)
    except ValueError as error:
        print(f"npugraph-ex bisect: {error}", file=sys.stderr)
        return EXIT_ERROR
    result = bisect(
        fn,
        *call_args,
        options=args.options if args.options is not None else options,
        rtol=args.rtol,
        atol=args.atol,
        static_kernels=not args.no_static_kernels,
        dump_dir=args.dump_dir,
        **kwargs,
    )
    print(result.report())
    if result.node is not None:
        print()
        print(result.node.text)
    return EXIT_SAME if result.layer is None else EXIT_DIFFERS
