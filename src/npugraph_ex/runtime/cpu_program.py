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

import keyword
from collections.abc import Callable, Sequence
from typing import Any

from npugraph_ex.runtime.cpu_steps import Step


def spelled_keyword(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def step_line(index: int, step: Step, names: dict[str, Any]) -> str:
    """The source line of one step, binding what it uses in ``names``."""
    fn, args, kwargs = step
    names[f"f{index}"] = fn
    arguments = []
    for position, value in enumerate(args):
        names[f"a{index}_{position}"] = value
        arguments.append(f"a{index}_{position}")
    if all(spelled_keyword(name) for name in kwargs):
        for name, value in kwargs.items():
            names[f"k{index}_{name}"] = value
            arguments.append(f"{name}=k{index}_{name}")
    else:
        names[f"k{index}"] = kwargs
        arguments.append(f"**k{index}")
    return f"    f{index}({', '.join(arguments)})"


def straight_line(steps: Sequence[Step]) -> Callable[[], None]:
    """A function that runs ``fn(*args, **kwargs)`` for every step, in order."""
    names: dict[str, Any] = {}
    lines = [step_line(index, step, names) for index, step in enumerate(steps)]
    source = "\n".join(["def replay_steps():", *lines, "    return None"])
    exec(compile(source, "<npugraph_ex cpu replay>", "exec"), names)  # noqa: S102
    return names["replay_steps"]
