"""Where and with what a result was measured: the record every benchmark writes with its figures.

A figure without its machine is not comparable with anything, so every JSON record carries the
CPU model, core count, torch's thread count, the load when it started, the package versions and
the source commit; a run on an accelerator also names it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.runtime.platform import platform_for


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or what ``platform`` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """The installed version of ``name``, or None when it is not importable."""
    try:
        module = __import__(name)
    except ImportError:
        return None
    return getattr(module, "__version__", "unknown")


def source_commit() -> str | None:
    """The commit of the checkout ``npugraph_ex`` is imported from, when it is a git checkout."""
    import npugraph_ex

    folder = Path(npugraph_ex.__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def mkl_intel_paths() -> bool | None:
    """Whether MKL runs its kernels for Intel CPUs here, or None where torch has no MKL.

    MKL picks its code path by CPU vendor: on other vendors' CPUs it takes generic paths, whose
    few-row products run at a different speed (``benchmarks/mkl_intel_path.py``). This asks
    MKL's vendor check, ``mkl_serv_intel_cpu_true``, as MKL's own calls find it: first in the
    process's global scope (where a preloaded library comes first), then in torch's CPU library.
    """
    if not torch.backends.mkl.is_available():
        return None
    for library in (None, str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")):
        try:
            return bool(ctypes.CDLL(library).mkl_serv_intel_cpu_true())
        except (OSError, AttributeError):
            continue
    return None


def environment(device: str = "cpu") -> dict[str, Any]:
    """Where and with what a result was measured; ``accelerator`` names the GPU of a CUDA run."""
    record: dict[str, Any] = {
        "device": cpu_model(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "npugraph_ex": package_version("npugraph_ex"),
        "npugraph_ex_commit": source_commit(),
    }
    if device == "cuda":
        record["accelerator"] = torch.cuda.get_device_name()
        record["cuda"] = torch.version.cuda
    else:
        record["host_probes"] = platform_for("cpu").host_decisions()
        record["mkl_intel_paths"] = mkl_intel_paths()
    return record


def environment_line(env: dict[str, Any]) -> str:
    """One line for a report: device, cores, threads and the versions that change the figures."""
    accelerator = (
        f"{env['accelerator']} (CUDA {env['cuda']}), host " if "accelerator" in env else ""
    )
    probes = env.get("host_probes")
    measured = (
        "; product rewrites: "
        + ", ".join(
            f"{name} {p['gain']}x ({'used' if p['used'] else 'not used'})"
            for name, p in probes.items()
        )
        if probes
        else ""
    )
    paths = env.get("mkl_intel_paths")
    mkl = "" if paths is None else f"; MKL's Intel code paths: {'yes' if paths else 'no'}"
    return (
        f"device: {accelerator}{env['device']} ({env['cores']} cores, torch threads "
        f"{env['torch_threads']}); python {env['python']}, torch {env['torch']}, "
        f"transformers {env['transformers']}{mkl}{measured}"
    )


def apply_threads(threads: int | None) -> None:
    """Set torch's intra-op threads when asked; None keeps torch's own choice."""
    if threads is not None:
        torch.set_num_threads(threads)
