"""Higher-order ops on the CPU: a graph holding ``torch.cond``, ``while_loop``, ``scan``, ``map``
or ``flex_attention`` is captured, and each replay re-issues the op whole (reading a predicate
anew, running the branch or the iterations eager would) and replays the kernels around it.
Before, such a graph ran eagerly on every call ("cannot record cond")."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch._higher_order_ops.map import map as map_over
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from helpers import ANY_SPEED, graphs_called, totals

SETTLE_SECONDS = 120


def two_conds(x: torch.Tensor, y: torch.Tensor, flag: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A predicate the graph computes (two results, one an integer count) and one it is given,
    each branch's results read by kernels after it."""
    h = torch.tanh(x) * y
    scaled, count = torch.cond(
        h.sum() > 0,
        lambda t, u: (t.sin() * 2, (u > 0).sum()),
        lambda t, u: (t.cos() + 1, (u < 0).sum()),
        (h, x),
    )
    shifted = torch.cond(flag, lambda t: t + 1, lambda t: t - 1, (scaled,))
    return shifted.relu() * count, scaled


def doublings(n: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` iterations, ``n`` read from the input on each call."""
    start = torch.zeros((), dtype=torch.int64)
    count, y = while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 2 + 1), (start, x))
    return y + 1, count


def cond_calls() -> list[tuple[torch.Tensor, ...]]:
    """Six calls of one shape taking every pair of branches: the computed predicate alternates,
    the given one is true every third call."""
    y = torch.rand(4, 4) + 0.5
    signs = (1.0, -1.0) * 3
    return [
        ((torch.rand(4, 4) + 0.1) * sign, y, torch.tensor(i % 3 == 0))
        for i, sign in enumerate(signs)
    ]


def assert_equal_outputs(got: tuple, expected: tuple, exact: bool = True) -> None:
    for a, b in zip(got, expected, strict=True):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b)


@torch.no_grad()
def test_each_replay_takes_the_branch_eager_takes() -> None:
    fn = torch.compile(two_conds, backend="npugraph_ex", options={"static_kernel_compile": False})
    for args in cond_calls():
        assert_equal_outputs(fn(*args), two_conds(*args))
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 5, 0)


@torch.no_grad()
def test_each_replay_runs_the_iterations_eager_runs() -> None:
    fn = torch.compile(doublings, backend="npugraph_ex", options={"static_kernel_compile": False})
    for n in (3, 0, 5, 2):
        x = torch.randn(3)
        assert_equal_outputs(fn(torch.tensor(n), x), doublings(torch.tensor(n), x))
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 3, 0)


def writing_branch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The true branch writes both operands (an input and an intermediate); ``torch.cond``
    allows it without grad."""
    h = y * 2
    out = torch.cond(
        x.sum() > 0, lambda a, b: a.sin_() + b.add_(1), lambda a, b: a.cos() + b, (x, h)
    )
    return out + h


def branch_writing_through_a_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda a: a[0].add_(1).sum() + a, lambda a: a.cos(), (x,)) + y


WRITING_BRANCHES = {"operands": writing_branch, "a view": branch_writing_through_a_view}


def branch_writing_its_own(x: torch.Tensor) -> torch.Tensor:
    """In place only on what the branch itself made."""
    return torch.cond(x.sum() > 0, lambda a: a.sin().add_(1), lambda a: a.cos(), (x,)) * 2


@pytest.mark.parametrize("written", sorted(WRITING_BRANCHES))
@torch.no_grad()
def test_a_branch_that_writes_its_operands_runs_eagerly(
    written: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A replay would write the input's static copy, not the caller's tensor; and a branch not
    # taken at capture could write what the capture took for read-only: such a graph keeps
    # running eagerly, with eager's writes.
    branch = WRITING_BRANCHES[written]
    try:
        branch(torch.ones(3, 3), torch.ones(3, 3))
    except torch._dynamo.exc.UncapturedHigherOrderOpError:
        pytest.skip("this torch refuses a torch.cond branch that writes its operands (2.11)")
    torch._dynamo.reset()
    fn = torch.compile(branch, backend="npugraph_ex", options={"static_kernel_compile": False})
    for sign in (1.0, -1.0, 1.0, -1.0):
        x, y = torch.rand(3, 3) * sign, torch.randn(3, 3)
        mine, eagers = x.clone(), x.clone()
        assert torch.equal(fn(mine, y), branch(eagers, y))
        assert torch.equal(mine, eagers)
    assert (totals()["captures"], totals()["eager_calls"]) == (0, 4)
    assert "control flow whose branch writes the tensors it is given: cond" in caplog.text


@torch.no_grad()
def test_a_branch_writing_only_what_it_made_is_captured() -> None:
    fn = torch.compile(
        branch_writing_its_own, backend="npugraph_ex", options={"static_kernel_compile": False}
    )
    for sign in (1.0, -1.0, 1.0):
        x = torch.rand(3, 3) * sign
        assert torch.equal(fn(x), branch_writing_its_own(x))
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 2, 0)


def running_means(xs: torch.Tensor, start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    def step(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        carry = carry * 0.5 + x
        return carry, carry.sin()

    last, each = scan(step, start, xs)
    return last + 1, each * 2


def mapped(xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return map_over(lambda x, y: x.cos() + y, xs, y) + 1


def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


def biased(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor):
    return s + (q - kv) * 0.1


def flex_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = create_block_mask(causal, None, None, q.shape[2], k.shape[2], device="cpu")
    return flex_attention(q * 2, k, v, score_mod=biased, block_mask=mask).relu()


OTHER_HIGHER_ORDER = {
    "scan": (running_means, lambda: (torch.randn(5, 3), torch.randn(3))),
    "map": (mapped, lambda: (torch.randn(4, 3), torch.randn(3))),
    "flex_attention": (flex_causal, lambda: tuple(torch.randn(1, 2, 128, 16) for _ in range(3))),
}


@pytest.mark.parametrize("name", sorted(OTHER_HIGHER_ORDER))
@torch.no_grad()
def test_other_higher_order_ops_replay(name: str) -> None:
    fn, make_args = OTHER_HIGHER_ORDER[name]
    compiled = torch.compile(fn, backend="npugraph_ex", options={"static_kernel_compile": False})
    # Dynamo alone is the reference: flex_attention called outside a compile warns and takes
    # another path.
    reference = torch.compile(fn, backend="aot_eager")
    for _ in range(3):
        args = make_args()
        got, expected = compiled(*args), reference(*args)
        assert_equal_outputs(*(o if isinstance(o, tuple) else (o,) for o in (got, expected)))
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 2, 0)


def flex_causal_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = create_block_mask(causal, None, None, q.shape[2], k.shape[2], device="cpu")
    return flex_attention(q, k, v, block_mask=mask)


@torch.no_grad()
def test_flex_attention_on_static_kernels() -> None:
    # The re-trace for Inductor keeps an item per result of flex attention; Inductor's CPU
    # lowering returns fewer when nothing reads the log-sum-exp, and the unread item failed
    # the compile ("tuple index out of range"): the key stayed on its ATen replay.
    options = {"static_kernel_compile": True}
    fn = torch.compile(flex_causal_alone, backend="npugraph_ex", options=options)
    reference = torch.compile(flex_causal_alone, backend="aot_eager")
    for _ in range(2):
        args = tuple(torch.randn(1, 2, 128, 16) for _ in range(3))
        torch.testing.assert_close(fn(*args), reference(*args), rtol=1e-5, atol=1e-5)
    (outcome,) = graphs_called()[0]["static_kernels"]
    assert outcome in ("compiled", "cache_hit")


def noisy_branch(x: torch.Tensor) -> torch.Tensor:
    noisy = torch.cond(x.sum() > 0, lambda t: t + torch.randn_like(t), lambda t: t * 2, (x,))
    return noisy + 1


@pytest.mark.parametrize("warmups", [1, 3])
@torch.no_grad()
def test_random_numbers_a_branch_draws_are_eagers(warmups: int) -> None:
    # The draw is inside the branch: the graph still counts as drawing random numbers, so the
    # warm-up's draws are undone and the first call draws what eager draws.
    options = {"static_kernel_compile": False, "num_warmup_iters": warmups}
    fn = torch.compile(noisy_branch, backend="npugraph_ex", options=options)
    for seed in range(5):
        x = torch.rand(4, 4) * (1 if seed % 2 == 0 else -1)
        torch.manual_seed(seed)
        got, after = fn(x).clone(), torch.rand(2)
        torch.manual_seed(seed)
        expected, eager_after = noisy_branch(x), torch.rand(2)
        assert torch.equal(got, expected), seed
        assert torch.equal(after, eager_after), seed
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 4, 0)


@torch.no_grad()
def test_static_kernels_of_a_graph_with_control_flow() -> None:
    fn = torch.compile(two_conds, backend="npugraph_ex", options={"static_kernel_compile": True})
    for args in cond_calls():
        assert_equal_outputs(fn(*args), two_conds(*args), exact=False)
    (outcome,) = graphs_called()[0]["static_kernels"]
    assert outcome in ("compiled", "cache_hit")
    assert (totals()["captures"], totals()["replays"], totals()["eager_calls"]) == (1, 5, 0)


@torch.no_grad()
def test_the_background_tier_swaps_in_kernels_of_a_graph_with_control_flow() -> None:
    options = {"background_compile_after": 2, "background_min_gain": ANY_SPEED}
    fn = torch.compile(two_conds, backend="npugraph_ex", options=options)
    deadline = time.monotonic() + SETTLE_SECONDS
    calls = cond_calls()
    for args in itertools.cycle(calls):
        assert_equal_outputs(fn(*args), two_conds(*args), exact=False)
        tiers = graphs_called()[0]["background"]
        if not {"aten", "queued", "pending", "trial"} & set(tiers):
            break
        assert time.monotonic() < deadline, tiers
        time.sleep(0.01)
    for args in calls:  # both branches of each cond, on the kernels
        assert_equal_outputs(fn(*args), two_conds(*args), exact=False)
    (graph,) = graphs_called()
    assert graph["background"] == {"kernels": 1}
    assert graph["eager_calls"] == {}
