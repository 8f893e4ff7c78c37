"""The generated replay function runs every step, in order, with its own arguments."""

from __future__ import annotations

from typing import Any

import torch

from npugraph_ex.runtime.cpu.program import bound_names, map_arguments, steps_of, straight_line


def test_steps_run_in_order_with_their_bound_arguments() -> None:
    a, b, c = torch.randn(4), torch.randn(4), torch.empty(4)
    order: list[str] = []

    def note(name: str, **kwargs: object) -> None:
        order.append(name)
        assert not kwargs or kwargs == {"from": 1, "dim": 0}

    steps = [
        (note, ("first",), {}),
        (torch.add, (a, b), {"out": c}),
        (torch.Tensor.mul_, (c, 2.0), {}),
        (note, ("keywords Python cannot spell",), {"from": 1, "dim": 0}),
    ]
    straight_line(steps)()
    assert torch.equal(c, (a + b) * 2)
    assert order == ["first", "keywords Python cannot spell"]


def test_no_steps_is_a_function_that_does_nothing() -> None:
    assert straight_line([])() is None


def test_captures_of_one_structure_share_code_and_keep_their_own_arguments() -> None:
    a, b = torch.randn(4), torch.randn(8)
    out_a, out_b = torch.empty(4), torch.empty(8)
    replay_a = straight_line([(torch.neg, (a,), {"out": out_a})])
    replay_b = straight_line([(torch.neg, (b,), {"out": out_b})])
    assert replay_a.run.__code__ is replay_b.run.__code__
    assert replay_a.layouts is replay_b.layouts
    replay_b()
    replay_a()
    assert torch.equal(out_a, -a) and torch.equal(out_b, -b)


def test_the_steps_read_back_from_the_function_are_the_very_steps_bound() -> None:
    a, c = torch.randn(4), torch.empty(4)

    def note(*args: object, **kwargs: object) -> None:
        pass

    steps = [
        (torch.add, (a, 1.0), {"out": c}),
        (note, (), {"from": 1, "dim": 0}),  # keywords Python cannot spell: bound as one dict
        (torch.Tensor.mul_, (c, 2.0), {}),
    ]
    read_back = steps_of(straight_line(steps))
    assert len(read_back) == len(steps)
    for (fn, args, kwargs), (want_fn, want_args, want_kwargs) in zip(read_back, steps, strict=True):
        assert fn is want_fn and kwargs == want_kwargs
        assert all(got is want for got, want in zip(args, want_args, strict=True))
    assert read_back[0][2]["out"] is c


def test_a_replay_binds_its_objects_in_one_tuple_not_a_dict_of_its_own() -> None:
    a, b = torch.randn(4), torch.randn(8)
    out_a, out_b = torch.empty(4), torch.empty(8)
    replay_a = straight_line([(torch.neg, (a,), {"out": out_a})])
    replay_b = straight_line([(torch.neg, (b,), {"out": out_b})])
    assert replay_a.run.__globals__ is replay_b.run.__globals__ == {}
    names = bound_names(replay_a)
    assert sorted(names) == ["a0_0", "f0", "k0_out"]
    assert names["f0"] is torch.neg and names["a0_0"] is a and names["k0_out"] is out_a
    swap = {id(a): b, id(out_a): out_b}
    map_arguments(replay_a, lambda value: swap.get(id(value), value))
    replay_a()
    assert torch.equal(out_b, -b)


def test_mapping_arguments_reaches_keywords_bound_as_one_dict_and_leaves_kernels_alone() -> None:
    a, b = torch.randn(4), torch.randn(4)
    seen: list[Any] = []

    def note(*args: Any, **kwargs: Any) -> None:
        seen.append((args, kwargs))

    replay = straight_line([(note, (a,), {"from": a, "dim": 0})])  # ``from``: one ``**`` dict
    map_arguments(replay, lambda value: b if value is a else value)
    replay()
    ((args, kwargs),) = seen
    assert args[0] is b and kwargs["from"] is b and kwargs["dim"] == 0
    assert steps_of(replay)[0][0] is note
