"""``cache_compile``'s argument checks, ``readable_cache`` and ``npugraph-ex cache``, in process."""

from __future__ import annotations

import logging
import math
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import npugraph_ex.inference
from helpers import aten_graph, intra_op_threads
from models import make_mlp
from npugraph_ex.bench.graphs import live_graph_numbers, managers_since
from npugraph_ex.cache.entry import entry_key
from npugraph_ex.cache.files import CacheFileError, read_entry, write_entry
from npugraph_ex.cache.fingerprint import PACKAGE, package_digest
from npugraph_ex.cli import main as cli_main
from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError, ConfigTypeError
from npugraph_ex.runtime.cpu import probes as host_probes
from npugraph_ex.torchair_compat import CompilerConfig, get_npu_backend


def plain_function(x: torch.Tensor) -> torch.Tensor:
    return x + 1


class NotAModule:
    def method(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize(
    ("func", "named"),
    [
        (plain_function, "function plain_function"),
        (NotAModule().method, "a method of NotAModule, which is not an nn.Module"),
    ],
)
def test_only_a_modules_bound_method_is_cached(func: object, named: str) -> None:
    with pytest.raises(ValueError, match="needs a bound method of a torch.nn.Module") as error:
        npugraph_ex.inference.cache_compile(func)  # type: ignore[arg-type]
    assert named in str(error.value)


def test_bad_arguments_name_the_fix(tmp_path: Path) -> None:
    forward = make_mlp().forward
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache_path'; it takes"):
        npugraph_ex.inference.cache_compile(forward, cache_path=tmp_path)
    with pytest.raises(ConfigError, match="unknown option"):
        npugraph_ex.inference.cache_compile(forward, options={"capture_limt": 2})
    with pytest.raises(ConfigTypeError, match="dynamic must be a bool"):
        npugraph_ex.inference.cache_compile(forward, dynamic="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match="tp_rank must be an int"):
        npugraph_ex.inference.cache_compile(forward, tp_rank="0")  # type: ignore[arg-type]


def test_config_and_options_merge(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.debug.aclgraph.static_capture_size_limit = 3
    cached = npugraph_ex.inference.cache_compile(
        make_mlp().forward, config=config, options={"clone_output": True}, cache_dir=tmp_path
    )
    assert (cached.config.capture_limit, cached.config.clone_output) == (3, True)


@pytest.mark.parametrize(
    ("ours", "torchair", "home"),
    [
        (None, None, None),
        (None, "torchair_home", "torchair_home"),
        ("our_home", None, "our_home"),
        ("our_home", "torchair_home", "our_home"),
        ("", "torchair_home", "torchair_home"),
    ],
)
def test_the_cache_home_is_ours_else_torchair_s(
    ours: str | None,
    torchair: str | None,
    home: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for variable, value in (("NPUGRAPH_EX_CACHE_HOME", ours), ("TORCHAIR_CACHE_HOME", torchair)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    expected = tmp_path / ".npugraph_ex_cache" if home is None else Path(home)
    assert npugraph_ex.inference.default_cache_dir() == expected
    cached = npugraph_ex.inference.cache_compile(make_mlp().forward)
    assert cached.cache_dir == expected


def test_a_backend_stands_for_its_config(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.debug.aclgraph.static_capture_size_limit = 3
    backend = get_npu_backend(compiler_config=config, custom_decompositions={GELU: exact_gelu})
    forward = make_mlp().forward
    cached = npugraph_ex.inference.cache_compile(forward, backend=backend, cache_dir=tmp_path)
    assert cached.config.capture_limit == 3
    assert cached.config.custom_decompositions == {GELU: exact_gelu}
    same = copy_of(config)
    assert (
        npugraph_ex.inference.cache_compile(
            forward, config=same, backend=backend, cache_dir=tmp_path
        ).config
        == cached.config
    )
    same.debug.aclgraph.static_capture_size_limit = 4
    with pytest.raises(ValueError, match="config differs from the CompilerConfig the backend"):
        npugraph_ex.inference.cache_compile(forward, config=same, backend=backend)
    with pytest.raises(ConfigTypeError, match="backend must be what npugraph_ex.get_npu_backend"):
        npugraph_ex.inference.cache_compile(forward, backend="npugraph_ex")  # type: ignore


def copy_of(config: CompilerConfig) -> CompilerConfig:
    return config.copy()


GELU = torch.ops.aten.gelu.default


def exact_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return x * 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def scaled_lambdas() -> list[Callable[..., Any]]:
    """Two functions of one name (``<lambda>``) whose code differs."""
    return [
        lambda x, approximate="none": x * 1.0,
        lambda x, approximate="none": x * 2.0,
    ]


def test_the_packages_own_source_is_part_of_the_cache_key(tmp_path: Path) -> None:
    # A stored graph is what this package's passes made of the trace: a build whose passes
    # changed, at the same version number, must not load it (one did: a remove_noop_ops fix
    # would not have reached graphs stored before it).
    key = entry_key(make_mlp().forward, Config(), dynamic=True, cache_dir=tmp_path, ranks={})
    version, digest = key.parts["npugraph_ex"].split()
    assert version == npugraph_ex.__version__ and digest == package_digest(PACKAGE)
    copy = tmp_path / "package"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert package_digest(copy) == digest
    edited = copy / "passes" / "remove_noop.py"
    edited.write_text(edited.read_text() + "\n# edited\n")
    package_digest.cache_clear()
    assert package_digest(copy) != digest


def test_decompositions_are_part_of_the_cache_key(tmp_path: Path) -> None:
    """Decompositions change the traced graph: an entry is found again only with the same ops
    and the same code, even where their functions share a name."""
    forward = make_mlp().forward

    def key(decompositions: dict[Any, Any] | None) -> str:
        config = Config(custom_decompositions=decompositions)
        return entry_key(forward, config, dynamic=True, cache_dir=tmp_path, ranks={}).digest

    one, two = scaled_lambdas()
    assert Config(custom_decompositions={GELU: one}).compute_hash() == (
        Config(custom_decompositions={GELU: two}).compute_hash()
    )
    keys = [key(None), key({GELU: one}), key({GELU: two}), key({torch.ops.aten.relu: one})]
    assert len(set(keys)) == len(keys)
    assert key({GELU: scaled_lambdas()[0]}) == keys[1]
    assert key(None) == keys[0]


def test_a_cached_graph_keeps_its_decompositions(tmp_path: Path) -> None:
    model = make_mlp()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = model(x)
        stored = npugraph_ex.inference.cache_compile(
            model.forward, cache_dir=tmp_path, custom_decompositions={GELU: exact_gelu}
        )
        torch.testing.assert_close(stored(x), want)
        torch._dynamo.reset()
        plain = npugraph_ex.inference.cache_compile(model.forward, cache_dir=tmp_path)
        torch.testing.assert_close(plain(x), want)
        torch._dynamo.reset()
        loaded = npugraph_ex.inference.cache_compile(
            model.forward, cache_dir=tmp_path, custom_decompositions={GELU: exact_gelu}
        )
        torch.testing.assert_close(loaded(x), want)
    assert plain.path != stored.path == loaded.path
    assert (loaded.cache_info()["hits"], loaded.cache_info()["compiled"]) == (1, 0)
    text = npugraph_ex.inference.readable_cache(stored.path, print_output=False)
    plain_text = npugraph_ex.inference.readable_cache(plain.path, print_output=False)
    assert ("torch.ops.aten.erf" in text, "torch.ops.aten.gelu" in text) == (True, False)
    assert ("torch.ops.aten.erf" in plain_text, "torch.ops.aten.gelu" in plain_text) == (
        False,
        True,
    )


def test_a_cached_call_is_eager_exact_and_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = make_mlp()
    cached = npugraph_ex.inference.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(cached(x), model(x))
    assert cached.cache_info()["saved"] == 1
    text = npugraph_ex.inference.readable_cache(
        tmp_path, print_output=False, file=tmp_path / "r.txt"
    )
    for part in ("method: ", "shape guards", "lowered graph", "caller bytecode", "__compiled_fn"):
        assert part in text
    assert (tmp_path / "r.txt").read_text().strip() == text.strip()

    assert cli_main(["cache", "list", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"MLP\.forward, 1 variant\(s\), \d+ KiB, created .*, ok", listed)
    assert cli_main(["cache", "clear", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("1 cache entry removed")
    assert not list(tmp_path.rglob("compiled_module"))


def test_a_process_runs_the_variant_it_stored_from_its_second_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the first call has stored its variant, the process's later calls take the stored
    variant's path (as a warm process does, past Dynamo's guards) on the graph it compiled: one
    capture manager, one capture, replays; a new shape still compiles and is stored, without the
    warning a warm process gives (nothing came from the file)."""
    model = make_mlp()
    cached = npugraph_ex.inference.cache_compile(model.forward, cache_dir=tmp_path, dynamic=False)
    xs = [torch.randn(4, 32) for _ in range(4)]
    before = live_graph_numbers()
    with torch.no_grad():
        first = cached(xs[0]).clone(), model(xs[0])
        through_dynamo = cached.compiled
        cached.compiled = None  # a call that went to Dynamo again would fail here
        later = [(cached(x).clone(), model(x)) for x in xs[1:]]
        cached.compiled = through_dynamo
        x = torch.randn(6, 32)
        with caplog.at_level(logging.WARNING, logger="npugraph_ex"):
            wider = cached(x).clone(), model(x)
    for got, want in [first, *later, wider]:
        assert torch.equal(got, want)
    assert [r for r in caplog.records if r.name.startswith("npugraph_ex")] == []
    info = cached.cache_info()
    assert (info["compiled"], info["saved"], info["hits"], info["variants"]) == (2, 2, 3, 2)
    assert info["build_seconds"] == 0.0
    manager = managers_since(before)[0]
    assert (manager.stats.captures, manager.stats.replays) == (1, 3)
    assert pickled_graph_bytes(cached) == 0  # the graph is built: no pickled copy is kept


def pickled_graph_bytes(cached: npugraph_ex.inference.CachedMethod) -> int:
    """Bytes of pickled graphs the method's variants still hold."""
    variants = [v for same_state in (cached.variants or {}).values() for v in same_state]
    return sum(len(graph.record.graph) for v in variants for graph in v.graphs)


def test_missing_paths_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["cache", "show", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().out.strip() == (
        f"npugraph-ex cache: {tmp_path / 'nowhere'}: no such cache file or folder"
    )


def test_files_are_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "entry" / "compiled_module"
    write_entry(path, {"key": "k"}, b"payload")
    header, payload = read_entry(path)
    assert (header["key"], payload, path.stat().st_mode & 0o777) == ("k", b"payload", 0o600)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CacheFileError, match=r"truncated: 6 payload bytes, the header says 7"):
        read_entry(path)
    path.write_bytes(b"something else\n{}\n")
    with pytest.raises(CacheFileError, match="not an npugraph_ex cache file"):
        read_entry(path)


def test_an_edited_traced_source_makes_the_entry_stale(tmp_path: Path) -> None:
    import pickle

    from npugraph_ex.cache.entry import load_variants

    model = make_mlp()
    cached = npugraph_ex.inference.cache_compile(model.forward, cache_dir=tmp_path)
    with torch.no_grad():
        cached(torch.randn(4, 32))
    header, payload = read_entry(cached.path)
    [variant] = pickle.loads(payload)
    traced = sorted(variant.traced_files)[0]
    variant.traced_files[traced] = "0" * 64
    write_entry(cached.path, header, pickle.dumps([variant]))
    with pytest.raises(CacheFileError, match=f"stale: {re.escape(traced)} changed since it was"):
        load_variants(cached.key)


class Shift(torch.nn.Module):
    """``n`` is data (a token count): it enters arithmetic and a tensor operand, sizes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
        return self.lin(x) + torch.arange(8) * (n - 1), n + 1


def test_a_stored_graph_keeps_its_host_ints(tmp_path: Path) -> None:
    torch.manual_seed(0)
    first, second = Shift(), Shift()
    second.load_state_dict(first.state_dict())
    x = torch.randn(2, 8)
    with torch.no_grad():
        npugraph_ex.inference.cache_compile(first.forward, cache_dir=tmp_path)(x, 3)
        loaded = npugraph_ex.inference.cache_compile(second.forward, cache_dir=tmp_path)
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        results = [(loaded(x, 3), first(x, 3)) for _ in range(3)]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before
    assert loaded.cache_info()["hits"] == 3 and loaded.cache_info()["compiled"] == 0
    assert pickled_graph_bytes(loaded) == 0  # unpickled once, at the first call
    for (got, got_n), (want, want_n) in results:
        assert torch.equal(got, want) and got_n == want_n == 4
    [path] = tmp_path.rglob("compiled_module")
    [variant] = pickle.loads(read_entry(path)[1])
    [graph] = variant.graphs
    assert graph.host is not None and graph.host.outputs == ((1, graph.host.order[-1][0]),)
    assert graph.facts.num_inputs == len(graph.host.kept) + len(graph.host.operands)


class Branches(torch.nn.Module):
    """A stream block beside the main path: the stored graph keeps its joins."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with npugraph_ex.scope.stream("side"):
            a = self.lin(x).relu()
        return a + x.sin()


def test_a_stored_graph_keeps_its_stream_joins(tmp_path: Path) -> None:
    torch.manual_seed(0)
    first, second = Branches(), Branches()
    second.load_state_dict(first.state_dict())
    x = torch.randn(4, 8)
    with torch.no_grad():
        npugraph_ex.inference.cache_compile(first.forward, cache_dir=tmp_path)(x)
        loaded = npugraph_ex.inference.cache_compile(second.forward, cache_dir=tmp_path)
        results = [(loaded(x), first(x)) for _ in range(3)]
    assert loaded.cache_info()["hits"] == 3 and loaded.cache_info()["compiled"] == 0
    for got, want in results:
        assert torch.equal(got, want)
    [path] = tmp_path.rglob("compiled_module")
    [variant] = pickle.loads(read_entry(path)[1])
    [graph] = variant.graphs
    assert graph.graph.count(b"stream_join") >= 1  # the pickled graph names the op it calls


class Projection(torch.nn.Module):
    """One linear layer the few-row split takes (a 256 x 128 weight by default)."""

    def __init__(self, outputs: int = 256, bias: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(128, outputs, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def loaded_manager(tmp_path: Path, make: Callable[[], torch.nn.Module], rows: list[int]) -> Any:
    """A dynamic graph of ``make()`` stored by one model, loaded by a second with the same
    weights and called with ``rows`` rows (each checked against the first): its capture
    manager."""
    torch.manual_seed(0)
    first, second = make(), make()
    second.load_state_dict(first.state_dict())
    with torch.no_grad(), intra_op_threads(2):
        stored = npugraph_ex.inference.cache_compile(
            first.forward, cache_dir=tmp_path, dynamic=True
        )
        stored(torch.randn(3, 128))
        loaded = npugraph_ex.inference.cache_compile(
            second.forward, cache_dir=tmp_path, dynamic=True
        )
        before = live_graph_numbers()
        for count in rows:
            x = torch.randn(count, 128)
            torch.testing.assert_close(loaded(x), first(x), rtol=1e-5, atol=1e-5)
    assert loaded.cache_info()["compiled"] == 0
    (manager,) = managers_since(before)
    return manager


def test_a_stored_dynamic_graph_specialises_its_few_row_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    manager = loaded_manager(tmp_path, Projection, [4, 5, 12])
    assert manager.stats.summary()["key_specialisation"] == {"specialised": 2}


def test_a_stored_graph_runs_its_products_through_onednn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_probes, "split_pays", lambda: True)
    monkeypatch.setattr(host_probes, "linear_pays", lambda rows=None: True)
    # 512 x 128: the smallest weight oneDNN's pattern takes; with a bias.
    manager = loaded_manager(tmp_path, lambda: Projection(512, bias=True), [4, 12])
    ops = [set(aten_graph(entry).step_names) for entry in manager.entries.values()]
    assert "aten.baddbmm.out" in ops[0]  # 4 rows: the split
    assert "compute_and_copy[mkldnn._linear_pointwise.default]" in ops[1]
