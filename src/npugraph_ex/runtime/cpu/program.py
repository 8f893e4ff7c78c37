"""The replay of a CPU capture as one generated function: one line per step, no loop.

A loop over ``(fn, args, kwargs)`` steps pays, for every kernel, the unpacking of the step and a
call through ``fn(*args, **kwargs)``, which copies the keyword dict and makes the binding parse it.
The generated function calls each kernel with its arguments by name, as hand-written code would:

    loop:       for fn, args, kwargs in steps: fn(*args, **kwargs)
    generated:  def replay_steps(bound):
                    (f0, a0_0, a0_1, k0_out, f1, a1_0, a1_1, k1_out,) = bound
                    f0(a0_0, a0_1, out=k0_out)
                    f1(a1_0, a1_1, out=k1_out)
                (``bound``, its default, holds the steps' own objects)

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

from npugraph_ex.runtime.cpu.steps import Step


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


NO_GLOBALS: dict[str, Any] = {}
"""The generated functions' globals: they read nothing but their one argument."""


class StraightLine:
    """A generated function that runs the steps in order (``run``), and the layout of each
    step's arguments (``layouts``), by which the steps are read back from what it binds."""

    __slots__ = ("layouts", "run")

    def __init__(self, run: Callable[[], None], layouts: tuple[Layout, ...]):
        self.run = run
        self.layouts = layouts

    def __call__(self) -> None:
        self.run()


def straight_line(steps: Sequence[Step]) -> StraightLine:
    """A function that runs ``fn(*args, **kwargs)`` for every step, in order (the steps can be
    read back from it: ``steps_of``).

    What the steps use is bound as one tuple, the function's default argument, unpacked into
    its locals on entry: a key keeps a tuple of its objects (8 bytes each) rather than a dict of
    names (about 26 KiB for 700 names), and a local is read as fast as a global.
    """
    names: dict[str, Any] = {}
    lines = [step_line(index, step, names) for index, step in enumerate(steps)]
    unpack = [f"    ({', '.join(names)},) = bound"] if names else []
    source = "\n".join(["def replay_steps(bound):", *unpack, *lines, "    return None"])
    code, layouts = replay_code(source, tuple(call_layout(step) for step in steps))
    run = types.FunctionType(code, NO_GLOBALS, "replay_steps", (tuple(names.values()),))
    return StraightLine(run, layouts)


def bound_names(replay: StraightLine) -> dict[str, Any]:
    """What a function made by ``straight_line`` binds, by name."""
    (values,) = replay.run.__defaults__  # type: ignore[attr-defined]
    unpacked = replay.run.__code__.co_varnames[1:]
    return dict(zip(unpacked, values, strict=True))


def map_arguments(replay: StraightLine, change: Callable[[Any], Any]) -> None:
    """Bind ``change(value)`` in place of every argument value the steps of ``replay`` (made by
    ``straight_line``) pass, positional or keyword; the kernels they call stay as they are."""
    names = bound_names(replay)
    for name, value in names.items():
        if name.startswith("f"):  # the step's kernel (``step_line`` names it f<index>)
            continue
        if isinstance(value, dict):  # keywords bound as one dict
            names[name] = {keyword: change(v) for keyword, v in value.items()}
        else:
            names[name] = change(value)
    replay.run.__defaults__ = (tuple(names.values()),)


def steps_of(replay: StraightLine) -> list[Step]:
    """The steps a function made by ``straight_line`` runs, read back from the names it binds
    (a capture keeps no other list of them: one per key would cost about 0.1 MiB)."""
    names = bound_names(replay)
    steps: list[Step] = []
    for index, (count, keywords) in enumerate(replay.layouts):
        args = tuple(names[f"a{index}_{position}"] for position in range(count))
        if keywords is None:
            kwargs = names[f"k{index}"]
        else:
            kwargs = {name: names[f"k{index}_{name}"] for name in keywords}
        steps.append((names[f"f{index}"], args, kwargs))
    return steps
