"""``get_npu_backend``: a ``torch.compile`` backend built from a TorchAir-style config.

What TorchAir does at this point and this backend does alike: the options are checked here, so a
bad value fails at this call; ``custom_decompositions`` go to AOTAutograd; a custom pass is
called with the config (``fn(gm, example_inputs, config)``, ``config.debug.run_eagerly.value``
and the rest reading as in TorchAir). What differs is said once, when the backend is built: the
fields that mean nothing off Ascend's graph engine, and ``mode`` left unset (TorchAir's default is
its graph engine; here it is capture and replay, see docs/options.md).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from npugraph_ex.config import Config
from npugraph_ex.debug.once import log_once
from npugraph_ex.errors import ConfigTypeError
from npugraph_ex.torchair_compat.groups import CUSTOM_PASSES, CompilerConfig

__all__ = ["ConfiguredBackend", "TorchAirPass", "get_compiler", "get_npu_backend"]

log = logging.getLogger(__name__)


def get_npu_backend(
    *,
    compiler_config: CompilerConfig | None = None,
    custom_decompositions: Mapping[Any, Any] | None = None,
) -> ConfiguredBackend:
    """Return a ``torch.compile`` backend configured by a TorchAir-style ``CompilerConfig``.

    ``custom_decompositions`` (ATen op -> function) are applied while AOTAutograd traces each
    graph (option ``custom_decompositions``). The options are validated here, so a bad value
    fails at this call rather than at the first compile.
    """
    if compiler_config is None:
        compiler_config = CompilerConfig()
    elif not isinstance(compiler_config, CompilerConfig):
        raise ConfigTypeError(
            "compiler_config must be a CompilerConfig or None, "
            f"got {type(compiler_config).__name__}"
        )
    make_data_dump_folder(compiler_config)
    compiler_config.to_config()  # a bad value fails here, named as the script spells it
    options = compiler_config.to_options()
    if custom_decompositions is not None:
        table = Config.from_options(
            {**options, "custom_decompositions": custom_decompositions}
        ).custom_decompositions
        if table is not None:
            options["custom_decompositions"] = table
    warn_unused_fields(compiler_config)
    say_mode(compiler_config)
    return ConfiguredBackend(options, compiler_config.copy())


def get_compiler(compiler_config: CompilerConfig | None = None) -> Callable[..., Any]:
    """TorchAir's ``get_compiler``: the graph compiler the backend runs on AOTAutograd's graph,
    configured by ``compiler_config``, for a backend of your own::

        compiler = get_compiler(config)
        backend = lambda gm, inputs: aot_module_simplified(gm, inputs, fw_compiler=compiler)

    It takes ``(gm, example_inputs)`` and returns a callable taking its arguments boxed (one
    list), as AOTAutograd expects (``compiler.compile_fx`` with the config's options)."""
    from npugraph_ex.compiler import compile_fx

    backend = get_npu_backend(compiler_config=compiler_config)
    return functools.partial(compile_fx, options=backend.merged({}))


def make_data_dump_folder(config: CompilerConfig) -> None:
    """TorchAir makes ``debug.data_dump.path`` when it dumps; the dump here needs it made."""
    path = config.debug.data_dump.path
    if config.debug.data_dump.type.value is not None and path is not None:
        os.makedirs(path, exist_ok=True)


def warn_unused_fields(config: CompilerConfig) -> None:
    unused = config.unused_fields()
    if unused:
        log_once(
            log,
            logging.WARNING,
            ("CompilerConfig fields unused", tuple(unused)),
            "npugraph_ex: these CompilerConfig fields mean nothing off Ascend's graph engine and "
            "are ignored: %s",
            ", ".join(unused),
        )


def say_mode(config: CompilerConfig) -> None:
    """Say once that ``mode`` left unset means capture and replay here.

    torchair.CompilerConfig defaults to its graph engine (``mode="max-autotune"``). A warning
    where the config sets graph-engine fields (the script was written for that engine), else an
    INFO line.
    """
    if config.mode.is_set:
        return
    level = logging.WARNING if config.unused_fields() else logging.INFO
    log_once(
        log,
        level,
        ("CompilerConfig mode unset", level),
        "npugraph_ex: CompilerConfig().mode is not set, so graphs are captured and replayed "
        "(mode='npugraph_ex'); TorchAir's torchair.CompilerConfig defaults to its graph engine "
        "(mode='max-autotune'). Set config.mode = 'max-autotune' to compile whole graphs with "
        "Inductor instead, or config.mode = 'npugraph_ex' to keep capture and replay and "
        "silence this message",
    )


class TorchAirPass:
    """A custom pass of a backend built by :func:`get_npu_backend`, called as TorchAir calls it:
    ``fn(gm, example_inputs, compiler_config)``, the config reading the options in effect.

    It carries the wrapped function's name and ``__wrapped__``, so the options hash and the
    compile cache key see the user's function, not this wrapper.
    """

    def __init__(self, fn: Callable[..., Any], compiler_config: CompilerConfig) -> None:
        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        self.compiler_config = compiler_config

    def __call__(self, gm: Any, example_inputs: Any, config: Config) -> Any:
        return self.fn(gm, example_inputs, self.compiler_config.reading(config))


class ConfiguredBackend:
    """The backend with a ``CompilerConfig``'s options, merged with ``torch.compile(...,
    options=...)``.

    ``torch.compile`` passes its ``options`` to the backend on every compile; they are added to
    the config's. An option set both ways to different values takes the ``options=`` value, the
    one written at the call, and a one-time warning names it with both values.
    """

    __name__ = "npugraph_ex"

    def __init__(
        self, options: Mapping[str, Any], compiler_config: CompilerConfig | None = None
    ) -> None:
        self.options = dict(options)
        self.compiler_config = compiler_config if compiler_config is not None else CompilerConfig()
        """What custom passes are given (reading the options in effect) and what
        ``cache_compile(backend=...)`` compares its ``config`` with."""

    def __call__(
        self,
        gm: Any,
        example_inputs: Any,
        *,
        options: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ) -> Any:
        # Imported here: the backend module imports the compiler stack, which imports this one.
        from npugraph_ex.dynamo_backend import npugraph_ex_backend

        return npugraph_ex_backend(
            gm, example_inputs, options=self.merged(options or {}), mode=mode
        )

    def merged(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The config's options updated with ``options``, warning once per conflict; custom
        passes wrapped to be given the config."""
        for name, value in options.items():
            if name in self.options and self.options[name] != value:
                log_once(
                    log,
                    logging.WARNING,
                    ("options= overrides CompilerConfig", name, repr(value)),
                    "torch.compile(options={%r: %r}) overrides the CompilerConfig's %s=%r; "
                    "set it in one place only",
                    name,
                    value,
                    name,
                    self.options[name],
                )
        merged = {**self.options, **options}
        for name in CUSTOM_PASSES:
            fn = merged.get(name)
            if callable(fn) and not isinstance(fn, TorchAirPass):
                merged[name] = TorchAirPass(fn, self.compiler_config)
        return merged
