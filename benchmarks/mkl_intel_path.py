"""Run a command with MKL taking its code paths for Intel CPUs, on a CPU of another vendor.

MKL chooses its kernels by CPU vendor as well as by instruction set: on an AMD CPU it takes
generic paths, on an Intel CPU with the same instructions its tuned ones, and few-row products (a
decode step's linear layers) run at very different speeds on the two. That is one reason a
figure measured on one host does not hold on another. This script answers MKL's vendor check
with "Intel" (a two-function library preloaded into the command, built here with the C compiler)
so that one machine can measure both paths:

    python benchmarks/mkl_intel_path.py -- npugraph-ex bench --peers --workloads decode,token
    python benchmarks/mkl_intel_path.py -- python benchmarks/breakdown.py

The benchmarks' report line says which path ran ("MKL's Intel code paths: yes"). On an Intel CPU
it changes nothing. It is a measuring device, not a setting to run models with: MKL does not
support its Intel paths on other vendors' CPUs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VENDOR_CHECK = """
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
"""


def build_library(folder: Path) -> Path:
    """The preloadable library answering MKL's vendor check, compiled into ``folder``."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("mkl_intel_path: no C compiler found (set CC)")
    source = folder / "mkl_intel_path.c"
    library = folder / "libmkl_intel_path.so"
    source.write_text(VENDOR_CHECK, encoding="utf-8")
    command = [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mkl_intel_path: {' '.join(command)} failed:\n{done.stderr}")
    return library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with tempfile.TemporaryDirectory(prefix="mkl_intel_path_") as folder:
        library = build_library(Path(folder))
        preload = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD")]))
        return subprocess.run(command, env={**os.environ, "LD_PRELOAD": preload}).returncode


if __name__ == "__main__":
    sys.exit(main())
