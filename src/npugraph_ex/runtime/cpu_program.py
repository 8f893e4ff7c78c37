"""The replay of a CPU capture as one generated function: one line per step, no loop.

A loop over ``(fn, args, kwargs)`` steps pays, for every kernel, the unpacking of the step and a
call through ``fn(*args, **kwargs)``, which copies the keyword dict and makes the binding parse it.
The generated function calls each kernel with its arguments by name, as hand-written code would:

    loop:       for fn, args, kwargs in steps: fn(*args, **kwargs)
    generated:  f0(a0_0, a0_1, out=k0_out)
                f1(a1_0, 2, out=k1_out)    (names bound to the step's own objects)

Every name is bound to the very object the step holds, so the function does exactly what the loop
does; a keyword Python cannot spell (``from``) keeps the ``**`` form for its step. On the tiny
Qwen3 decode step (235 steps, 2.2 to 2.8 ms of CPU time per replay) it saves a few percent:
``benchmarks/generated_replay.py``, four runs of five faster by 2% to 10%.
"""

from __future__ import annotations

import functools
import keyword
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from npugraph_ex.runtime.cpu_memory import storage_key
from npugraph_ex.runtime.cpu_steps import Step


def spelled_keyword(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def step_line(index: int, step: Step, names: dict[str, Any]) -> str:
    """The source line of one step, binding what it uses in ``names``."""
    fn, args, kwargs = step

    def bind(name: str, value: Any) -> str:
        name = sys.intern(name)  # one string per name, whichever capture binds it
        names[name] = value
        return name

    arguments = [bind(f"a{index}_{position}", value) for position, value in enumerate(args)]
    if all(spelled_keyword(name) for name in kwargs):
        for name, value in kwargs.items():
            arguments.append(f"{name}={bind(f'k{index}_{name}', value)}")
    else:
        arguments.append(f"**{bind(f'k{index}', kwargs)}")
    return f"    {bind(f'f{index}', fn)}({', '.join(arguments)})"


Layout = tuple[int, tuple[str, ...] | None]
"""How a step's call is spelled: its positional count, and its keyword names (None: passed as
one ``**`` dict)."""


def call_layout(step: Step) -> Layout:
    _, args, kwargs = step
    return len(args), (tuple(kwargs) if all(spelled_keyword(n) for n in kwargs) else None)


@functools.lru_cache(maxsize=256)
def replay_code(source: str, layouts: tuple[Layout, ...]) -> tuple[types.CodeType, tuple]:
    """The code of a generated replay function, and its steps' layouts. Captures of one graph
    at other sizes run the same kernels with the same argument structure, so their source, the
    code and the layouts are one object for all of them."""
    module = compile(source, "<npugraph_ex cpu replay>", "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType)), layouts


def straight_line(steps: Sequence[Step]) -> Callable[[], None]:
    """A function that runs ``fn(*args, **kwargs)`` for every step, in order (the steps can be
    read back from it: ``steps_of``)."""
    names: dict[str, Any] = {}
    lines = [step_line(index, step, names) for index, step in enumerate(steps)]
    source = "\n".join(["def replay_steps():", *lines, "    return None"])
    code, layouts = replay_code(source, tuple(call_layout(step) for step in steps))
    replay = types.FunctionType(code, names, "replay_steps")
    replay.step_layouts = layouts  # type: ignore[attr-defined]
    return replay


def steps_of(replay: Callable[[], None]) -> list[Step]:
    """The steps a function made by ``straight_line`` runs, read back from the names it binds
    (a capture keeps no other list of them: one per key would cost about 0.1 MiB)."""
    names = replay.__globals__  # type: ignore[attr-defined]
    steps: list[Step] = []
    for index, (count, keywords) in enumerate(replay.step_layouts):  # type: ignore[attr-defined]
        args = tuple(names[f"a{index}_{position}"] for position in range(count))
        if keywords is None:
            kwargs = names[f"k{index}"]
        else:
            kwargs = {name: names[f"k{index}_{name}"] for name in keywords}
        steps.append((names[f"f{index}"], args, kwargs))
    return steps


def share_equal_views(replay: Callable[[], None], storage: torch.UntypedStorage) -> int:
    """Bind one tensor object wherever the steps of ``replay`` use views of ``storage`` (a
    pool's arena) with the same element offset, sizes, strides and dtype; returns how many
    objects were let go.

    Placed in the arena, intermediates that share bytes at different times often end up with
    the same geometry (each layer's MLP output at the same offset): two tensor objects that are
    one and the same memory to every kernel. A key keeps one object per geometry, about a third
    of them on a Qwen3 forward. Nothing re-points the arena's views one by one after placement
    (growing the arena resizes its one storage), so one object serves every step that used any
    of them.
    """
    names = replay.__globals__  # type: ignore[attr-defined]
    arena = storage._cdata
    shared: dict[tuple, torch.Tensor] = {}
    let_go: set[int] = set()

    def one_of(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(one_of(v) for v in value)
        if not isinstance(value, torch.Tensor) or storage_key(value) != arena:
            return value
        geometry = (value.storage_offset(), value.shape, value.stride(), value.dtype)
        geometry += (value.is_neg(), value.is_conj())
        kept = shared.setdefault(geometry, value)
        if kept is not value:
            let_go.add(id(value))
        return kept

    for name, value in names.items():
        if isinstance(value, dict):
            names[name] = {key: one_of(v) for key, v in value.items()}
        elif name[0] != "f":
            names[name] = one_of(value)
    return len(let_go)
