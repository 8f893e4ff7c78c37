"""TorchAir's ``inference`` entry points: a compile cache for a module's methods.

    model.forward = npugraph_ex.inference.cache_compile(model.forward, options={...})

The first process compiles as ``torch.compile`` would and stores what it compiled; a later
process with the same model class, options and versions skips Dynamo, AOTAutograd and the
passes and goes straight to capture. See ``docs/guide.md``, "Compile cache".
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from npugraph_ex.cache.method import CachedMethod
from npugraph_ex.cache.readable import readable_entries
from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import ConfigTypeError
from npugraph_ex.torchair_compat import CompilerConfig, ConfiguredBackend, get_npu_backend

__all__ = ["cache_compile", "default_cache_dir", "readable_cache"]

log = logging.getLogger(__name__)

CACHE_HOME_VARIABLE = "NPUGRAPH_EX_CACHE_HOME"
TORCHAIR_CACHE_HOME_VARIABLE = "TORCHAIR_CACHE_HOME"
"""TorchAir's variable for the same folder, honoured when ours is not set."""
ASCEND_ONLY_ARGUMENTS = ("ge_cache",)
"""TorchAir arguments for its graph engine: accepted, with a one-time warning."""


def default_cache_dir() -> Path:
    """``$NPUGRAPH_EX_CACHE_HOME``, else ``$TORCHAIR_CACHE_HOME``, else ``.npugraph_ex_cache``
    in the working directory."""
    for variable in (CACHE_HOME_VARIABLE, TORCHAIR_CACHE_HOME_VARIABLE):
        home = os.environ.get(variable)
        if home:
            return Path(home)
    return Path.cwd() / ".npugraph_ex_cache"


def cache_compile(
    func: Callable[..., Any],
    *,
    config: CompilerConfig | None = None,
    backend: ConfiguredBackend | None = None,
    dynamic: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    global_rank: int | None = None,
    tp_rank: int | None = None,
    pp_rank: int | None = None,
    custom_decompositions: Mapping[Any, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> CachedMethod:
    """Compile ``func``, a bound method of an ``nn.Module``, through a cache on disk.

    ``config`` (a ``CompilerConfig``) and ``options`` (flat option names) are merged, ``options``
    winning a conflict with a one-time warning; ``backend``, what :func:`get_npu_backend`
    returned, stands for its config and ``custom_decompositions`` (a ``config`` given too must
    equal its config, as in TorchAir). The cache lives under ``cache_dir`` (default
    :func:`default_cache_dir`), one entry per model class, method, options, ``dynamic`` and
    ranks; ``global_rank`` defaults to this process's rank when ``torch.distributed`` runs with
    more than one process.
    """
    if not isinstance(func, types.MethodType) or not isinstance(func.__self__, torch.nn.Module):
        raise ValueError(
            "cache_compile needs a bound method of a torch.nn.Module, such as model.forward; "
            f"got {describe_callable(func)}. Wrap the code in a module's method to cache it, "
            "or compile it with torch.compile(fn, backend='npugraph_ex')."
        )
    for name in kwargs:
        if name not in ASCEND_ONLY_ARGUMENTS:
            valid = (
                "config, backend, dynamic, cache_dir, global_rank, tp_rank, pp_rank, "
                "custom_decompositions, options"
            )
            raise TypeError(
                f"cache_compile() got an unexpected keyword argument {name!r}; it takes {valid}"
            )
        log_once(
            log,
            logging.WARNING,
            ("cache_compile", name),
            "npugraph_ex: cache_compile(%s=...) is for Ascend's graph engine; ignored",
            name,
        )
    if not isinstance(dynamic, bool):
        raise ConfigTypeError(f"cache_compile: dynamic must be a bool, got {dynamic!r}")
    if backend is None:
        backend = get_npu_backend(
            compiler_config=config, custom_decompositions=custom_decompositions
        )
    else:
        backend = backend_with(backend, config, custom_decompositions)
    return CachedMethod(  # validates the options: a bad one fails here, not at the first call
        func,
        options=backend.merged(dict(options or {})),
        dynamic=dynamic,
        cache_dir=Path(cache_dir) if cache_dir is not None else default_cache_dir(),
        ranks=ranks_of(global_rank, tp_rank, pp_rank),
    )


def backend_with(
    backend: Any, config: CompilerConfig | None, decompositions: Mapping[Any, Any] | None
) -> ConfiguredBackend:
    """``backend``, checked as TorchAir checks it, with ``decompositions`` where given."""
    if not isinstance(backend, ConfiguredBackend):
        raise ConfigTypeError(
            "cache_compile: backend must be what npugraph_ex.get_npu_backend() returns, "
            f"got {type(backend).__name__}"
        )
    if config is not None and config != backend.compiler_config:
        raise ValueError(
            "cache_compile: config differs from the CompilerConfig the backend was built with; "
            "pass only one of them"
        )
    if decompositions is None:
        return backend
    table = Config.from_options({"custom_decompositions": decompositions}).custom_decompositions
    return ConfiguredBackend(
        {**backend.options, "custom_decompositions": table}, backend.compiler_config
    )


def ranks_of(global_rank: int | None, tp_rank: int | None, pp_rank: int | None) -> dict[str, int]:
    ranks = {}
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        if distributed.get_world_size() > 1:
            ranks["world"] = distributed.get_world_size()
            ranks["global_rank"] = distributed.get_rank() if global_rank is None else global_rank
    elif global_rank is not None:
        ranks["global_rank"] = global_rank
    for name, value in (("tp_rank", tp_rank), ("pp_rank", pp_rank)):
        if value is not None:
            ranks[name] = value
    for name, value in ranks.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigTypeError(f"cache_compile: {name} must be an int, got {value!r}")
    return ranks


def readable_cache(
    path: str | os.PathLike[str],
    print_output: bool = True,
    file: str | os.PathLike[str] | None = None,
) -> str:
    """What the cache file at ``path`` (or every cache file under the folder ``path``) holds:
    its key, versions and, per variant, the argument state, shape guards, graph and bytecode.
    Printed unless ``print_output`` is False; also written to ``file`` when given."""
    text = readable_entries(Path(path))
    if print_output:
        print(text)
    if file is not None:
        target = Path(file)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
        target.chmod(0o600)
    return text


def describe_callable(func: Any) -> str:
    if isinstance(func, types.MethodType):
        return f"a method of {type(func.__self__).__name__}, which is not an nn.Module"
    name = getattr(func, "__qualname__", None)
    return f"{type(func).__name__} {name}" if name else repr(func)
