"""The backend as users reach it: by name, through TorchAir-style config, through compile_fx."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified

import npugraph_ex
from npugraph_ex.errors import ConfigError


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("name", ["npugraph_ex", "npugraph_ex_portable"])
def test_backend_name_works_without_importing_the_package(name: str) -> None:
    result = run_python(
        f"""
        import sys, torch
        fn = torch.compile(lambda x: x * 2 + 1, backend="{name}", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(fn(torch.ones(3)), torch.full((3,), 3.0))
        import npugraph_ex
        print(npugraph_ex.stats()["totals"]["replays"])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_the_package_alone_reaches_its_torchair_modules() -> None:
    result = run_python(
        """
        import npugraph_ex
        cache = npugraph_ex.inference
        print(cache.cache_compile.__name__, cache.readable_cache.__name__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cache_compile", "readable_cache"]


def test_a_name_taken_by_another_backend_is_not_replaced() -> None:
    result = run_python(
        """
        import logging, torch
        from torch._dynamo.backends.registry import lookup_backend, register_backend
        logging.basicConfig(level=logging.WARNING, format="%(message)s")

        def other_backend(gm, example_inputs):
            return gm.forward

        register_backend(compiler_fn=other_backend, name="npugraph_ex")
        import npugraph_ex
        assert lookup_backend("npugraph_ex") is other_backend
        assert lookup_backend("npugraph_ex_portable") is npugraph_ex.backend
        fn = torch.compile(lambda x: x + 1, backend="npugraph_ex_portable")
        with torch.no_grad():
            fn(torch.ones(2)); fn(torch.ones(2))
        print(npugraph_ex.stats()["totals"]["replays"])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert (
        "backend='npugraph_ex' is registered by __main__, not by this package; use "
        "backend='npugraph_ex_portable' or backend=npugraph_ex.backend" in result.stderr
    )


def test_unknown_option_fails_at_compile_with_the_valid_names() -> None:
    fn = torch.compile(lambda x: x + 1, backend="npugraph_ex", options={"captur_limit": 3})
    with pytest.raises(Exception) as raised:
        fn(torch.ones(2))
    cause = raised.value
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, ConfigError)
    assert "unknown option 'captur_limit'" in str(cause)
    assert "did you mean 'capture_limit'?" in str(cause)


@torch.no_grad()
def test_reduce_overhead_mode_captures_quietly() -> None:
    fn = torch.compile(lambda x: x.exp(), backend="npugraph_ex", mode="reduce-overhead")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn(torch.ones(3))
    fn(torch.ones(3))
    assert npugraph_ex.stats()["totals"]["replays"] == 1


@torch.no_grad()
def test_torchair_style_script_runs_with_only_the_import_changed() -> None:
    config = npugraph_ex.CompilerConfig()
    config.mode = "npugraph_ex"
    config.debug.aclgraph.static_capture_size_limit = 1
    config.experimental_config.frozen_parameter = True
    backend = npugraph_ex.get_npu_backend(compiler_config=config)
    lin = torch.nn.Linear(3, 3)
    fn = torch.compile(lin, backend=backend, dynamic=True)
    for rows in (2, 3, 2):
        x = torch.randn(rows, 3)
        assert torch.equal(fn(x), lin(x))
    totals = npugraph_ex.stats()["totals"]
    assert (totals["captures"], totals["replays"], totals["eager_calls"]) == (1, 1, 1)


@torch.no_grad()
def test_torchair_run_eagerly_means_force_eager() -> None:
    config = npugraph_ex.CompilerConfig()
    config.debug.run_eagerly = True
    fn = torch.compile(lambda x: x * 3, backend=npugraph_ex.get_npu_backend(compiler_config=config))
    fn(torch.ones(2))
    assert npugraph_ex.stats()["graphs"][-1]["eager_calls"] == {"force_eager": 1}


@torch.no_grad()
def test_compile_fx_serves_a_users_own_backend() -> None:
    def my_backend(gm, example_inputs):
        def inference(aot_gm, aot_inputs):
            return npugraph_ex.compile_fx(aot_gm, aot_inputs, options={"clone_output": True})

        return aot_module_simplified(gm, example_inputs, fw_compiler=inference)

    fn = torch.compile(lambda x: x.sin() * 2, backend=my_backend)
    x = torch.randn(4)
    first, second = fn(x), fn(x)
    assert torch.equal(first, x.sin() * 2)
    assert first.data_ptr() != second.data_ptr()  # clone_output reached the capture manager
    assert npugraph_ex.stats()["totals"]["replays"] == 1


@torch.no_grad()
def test_backend_object_is_usable_directly() -> None:
    fn = torch.compile(lambda x: x - 1, backend=npugraph_ex.backend)
    fn(torch.ones(2))
    fn(torch.ones(2))
    assert npugraph_ex.stats()["totals"]["replays"] == 1
