"""Int inputs that are data (the ``split_host_ints`` pass): every value replays one capture.

An int that only enters arithmetic, tensor operands and int outputs leaves the device graph: the
host computes its arithmetic per call and passes the operands as 0-d tensors. Any other use keeps
the int baked into the capture, a key per value, as before.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same, totals


def compiled(fn):  # noqa: ANN001, ANN201
    return torch.compile(fn, backend="npugraph_ex", fullgraph=True, dynamic=True)


def offset_and_next(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """A position-like int: added to a tensor (after some arithmetic), and returned advanced."""
    return x * n + max(n - 3, 0), n + 1


@torch.no_grad()
def test_an_int_that_is_data_replays_one_capture(device: str) -> None:
    fn = compiled(offset_and_next)
    x = torch.arange(4.0, device=device)
    for n in (1, 2, 5, 9, 2):  # below and above the max's threshold, and back
        got, advanced = fn(x, n)
        expected, _ = offset_and_next(x, n)
        assert_same(got, expected, device)
        assert advanced == n + 1
    assert totals()["captures"] == 1
    assert totals()["replays"] == 4


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.bool])
def test_the_operand_promotes_as_the_int_does(device: str, dtype: torch.dtype) -> None:
    def add(x: torch.Tensor, n: int) -> torch.Tensor:
        return x + n

    fn = compiled(add)
    x = torch.ones(3, device=device).to(dtype)
    for n in (1, 2, 3):
        got = fn(x, n)
        assert got.dtype == add(x, n).dtype
        assert_same(got, add(x, n), device)
    assert totals()["replays"] == 2


@torch.no_grad()
def test_an_int_beside_a_zero_dim_tensor_stays_baked(device: str) -> None:
    """A 0-d int64 tensor would promote a 0-d int32 tensor where the int does not."""

    def add(x: torch.Tensor, n: int) -> torch.Tensor:
        return x + n

    fn = compiled(add)
    x = torch.tensor(1, dtype=torch.int32, device=device)
    for n in (1, 2, 3):
        got = fn(x, n)
        assert got.dtype == torch.int32
        assert_same(got, add(x, n), device)
    assert totals()["replays"] == 0


@torch.no_grad()
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, n: torch.roll(x, n),  # an int[] argument
        lambda x, n: x + (n + x.shape[0]),  # arithmetic with a tensor's size
    ],
    ids=["roll shifts", "arithmetic with a size"],
)
def test_other_uses_keep_the_int_baked(device: str, fn) -> None:  # noqa: ANN001
    compiled_fn = compiled(fn)
    x = torch.arange(5.0, device=device)
    for n in (1, 2, 3, 2):
        assert_same(compiled_fn(x, n), fn(x, n), device)
    # Every value is a key of its own; 2, seen before, replays.
    assert totals()["captures"] == 3
    assert totals()["replays"] == 1


def two_ints(x: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, int, torch.Tensor, int]:
    return x + (n + m), n * m, x * m, n


@torch.no_grad()
@pytest.mark.parametrize("options", [None, {"force_eager": True}], ids=["replayed", "eager"])
def test_arithmetic_of_two_ints_and_int_outputs_come_back_in_place(
    device: str, options: dict | None
) -> None:
    fn = torch.compile(
        two_ints, backend="npugraph_ex", fullgraph=True, dynamic=True, options=options
    )
    x = torch.arange(3.0, device=device)
    for n, m in ((2, 3), (5, 7), (4, 4)):
        got, expected = fn(x, n, m), two_ints(x, n, m)
        assert got[1] == expected[1] and got[3] == expected[3]
        assert_same(got[0], expected[0], device)
        assert_same(got[2], expected[2], device)
    if options is None:
        assert totals()["captures"] == 1
        assert totals()["replays"] == 2
    else:
        assert totals()["eager_calls"] == 3


@torch.no_grad()
def test_with_the_pass_disabled_every_value_is_a_key_of_its_own() -> None:
    fn = torch.compile(
        offset_and_next,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options={"disabled_passes": ["split_host_ints"]},
    )
    x = torch.arange(4.0)
    for n in (1, 2, 5, 2):
        got, advanced = fn(x, n)
        assert torch.equal(got, offset_and_next(x, n)[0]) and advanced == n + 1
    assert totals()["captures"] == 3
    assert totals()["replays"] == 1


def test_the_split_graph_is_what_the_last_dump_shows(tmp_path) -> None:
    fn = torch.compile(
        offset_and_next,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=True,
        options={"debug_dump_dir": str(tmp_path)},
    )
    with torch.no_grad():
        fn(torch.arange(4.0), 3)
    (folder,) = tmp_path.iterdir()
    last = sorted(folder.glob("[0-9][0-9]_*.py"))[-1]
    assert last.name.endswith("_after_split_host_ints.py")
    assert "_tensor" in last.read_text()  # the int arrives as a 0-d tensor input
    assert "_tensor" in (folder / "captured.py").read_text()  # and that graph is captured
