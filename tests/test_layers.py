"""Imports point down: every module of the package imports only its own layer or those below it.

The layers, top to bottom, are the ones the package docstring lists (``npugraph_ex.__doc__``). A
module's layer is read from its path alone (its first folder, or its file at the top); every
import counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import npugraph_ex

PACKAGE = Path(npugraph_ex.__file__).resolve().parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "tools/", "bench/"),
    ("inference", "cache/", "__init__"),
    ("torchair_compat/", "dynamo_backend", "registration", "model_floats"),
    ("compiler",),
    ("capture/", "kernels/"),
    ("passes/",),
    ("runtime/",),
    ("scope/", "ops", "debug/"),
    ("config", "option_checks", "errors", "compat", "schemas", "fixed_views", "process_state"),
)
"""Top to bottom; a module may import its own layer and those below it."""

LAYER_OF = {part: depth for depth, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """The path part that names a module's layer: ``capture/`` for ``npugraph_ex.capture.x``,
    ``cli`` for ``npugraph_ex.cli``, ``__init__`` for the package itself."""
    names = module.split(".")[1:]
    if not names:
        return "__init__"
    return f"{names[0]}/" if (PACKAGE / names[0]).is_dir() else names[0]


def is_module(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(path: Path) -> set[str]:
    """The package's modules that ``path`` imports (a name imported from a package counts as its
    submodule where it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base)
    return {m for m in found if m == "npugraph_ex" or m.startswith("npugraph_ex.")}


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({part_of(module_name(p)) for p in MODULES} - set(LAYER_OF))
    assert not unplaced, f"place {unplaced} in LAYERS (and in the package docstring)"


def test_the_docstring_lists_the_layers_in_order() -> None:
    text = " ".join(npugraph_ex.__doc__.split())
    lines = [", ".join(f"``{p}``" for p in parts) for parts in LAYERS]
    missing = [line for line in lines if line not in text]
    assert not missing, f"the package docstring does not list {missing}"
    positions = [text.index(line) for line in lines]
    assert positions == sorted(positions), "the package docstring lists the layers out of order"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_down(path: Path) -> None:
    importer = module_name(path)
    layer = LAYER_OF[part_of(importer)]
    upward = [
        f"{importer} ({', '.join(LAYERS[layer])}) imports {imported} "
        f"({', '.join(LAYERS[LAYER_OF[part_of(imported)]])}), a layer above it"
        for imported in sorted(imported_modules(path))
        if LAYER_OF[part_of(imported)] < layer
    ]
    assert not upward, "\n".join(upward)


PATTERNS = PACKAGE / "passes" / "patterns"


@pytest.mark.parametrize("path", sorted(PATTERNS.glob("[!_]*.py")), ids=lambda p: module_name(p))
def test_pattern_modules_never_import_their_package_back(path: Path) -> None:
    # The package's ``__init__`` only hands names on (from ``registry``); a pattern module takes
    # them from where they are made, so importing any one module never runs the others.
    assert "npugraph_ex.passes.patterns" not in imported_modules(path)
    if path.stem != "builtin":  # the one list of patterns imports them, never the other way
        assert "npugraph_ex.passes.patterns.builtin" not in imported_modules(path)


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if not module_name(p).startswith("npugraph_ex.runtime")],
    ids=lambda p: module_name(p),
)
def test_only_the_runtime_reaches_into_a_device_s_modules(path: Path) -> None:
    # Above ``runtime/`` a device is reached through its runtime and its platform
    # (``runtime_for``, ``platform_for``), never through one device's own modules.
    devices = ("npugraph_ex.runtime.cpu", "npugraph_ex.runtime.cuda", "npugraph_ex.runtime.npu")
    reached = [m for m in imported_modules(path) if m.startswith(devices)]
    assert not reached, f"{module_name(path)} imports {reached}"


def process_state(path: Path) -> list[str]:
    """The module-level names of ``path`` bound to state that changes while the process runs:
    an empty container, or an instance made with no arguments (a lock, a registry)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
            getattr(value, "keys", None) or getattr(value, "elts", None)
        )
        call = isinstance(value, ast.Call) and not value.args and not value.keywords
        name = ast.unparse(value.func).rpartition(".")[2] if call else ""
        made = call and (name[:1].isupper() or name in {"set", "dict", "list", "local", "count"})
        if isinstance(target, ast.Name) and (empty or made):
            found.append(target.id)
    return found


STATEFUL = [
    f"{module_name(p).removeprefix('npugraph_ex.')}.{name}"
    for p in MODULES
    for name in process_state(p)
]


@pytest.mark.parametrize("name", STATEFUL)
def test_process_wide_state_is_listed_with_its_reason(name: str) -> None:
    from npugraph_ex.process_state import PROCESS_STATE

    assert name in PROCESS_STATE, (
        f"{name} is state kept for the whole process: put it on an object, or list it in "
        "npugraph_ex/process_state.py with why it is the process's"
    )


def test_the_list_of_process_wide_state_names_only_what_exists() -> None:
    from npugraph_ex.process_state import PROCESS_STATE

    assert sorted(PROCESS_STATE) == sorted(STATEFUL)
