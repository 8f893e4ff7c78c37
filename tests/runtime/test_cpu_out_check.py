"""Replay trusts an ``out=`` overload only once a trial shows it writes its output in place."""

from __future__ import annotations

import torch

import npugraph_ex
from npugraph_ex.runtime.cpu import out_check as cpu_out_check
from npugraph_ex.runtime.cpu.out_check import writes_in_place

aten = torch.ops.aten


def test_an_overload_that_writes_in_place_is_trusted() -> None:
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    assert writes_in_place(aten.mul.out, (x, y), {}, ("out",), [x * y])


def test_an_overload_that_computes_another_value_into_a_reduced_out_is_not() -> None:
    # aten.binary_cross_entropy.out given an out of the reduced (0-d) shape computes another value.
    x, y = torch.rand(5, 5), torch.rand(5, 5)
    want = torch.nn.functional.binary_cross_entropy(x, y)
    assert not writes_in_place(aten.binary_cross_entropy.out, (x, y), {}, ("out",), [want])


def test_an_overload_that_resizes_its_out_is_not() -> None:
    # aten.soft_margin_loss.out resizes out to the input's shape before it reduces.
    x, y = torch.randn(5, 5), torch.randn(5, 5).sign()
    want = torch.nn.functional.soft_margin_loss(x, y)
    assert not writes_in_place(aten.soft_margin_loss.out, (x, y, 1), {}, ("out",), [want])


def test_a_trial_compares_bits_nans_equal_and_signed_zeros_not() -> None:
    x = torch.tensor([float("nan"), 1.0, -2.0])
    assert writes_in_place(aten.mul.out, (x, x), {}, ("out",), [x * x])
    zero = torch.tensor([0.0, 1.0])
    # mul(0, -1) is -0.0: a result recorded as +0.0 is not the same bits.
    assert not writes_in_place(
        aten.mul.out, (zero, -1.0), {}, ("out",), [torch.tensor([0.0, -1.0])]
    )


def test_verdicts_are_kept_for_the_latest_layouts_only(monkeypatch) -> None:
    monkeypatch.setattr(cpu_out_check, "VERDICTS", {})
    monkeypatch.setattr(cpu_out_check, "VERDICT_LIMIT", 8)
    for rows in range(1, 21):
        x = torch.randn(rows, 3)
        assert writes_in_place(aten.mul.out, (x, x), {}, ("out",), [x * x])
    assert len(cpu_out_check.VERDICTS) == 8
    assert [key[1][0][0][0] for key in cpu_out_check.VERDICTS] == [(r, 3) for r in range(13, 21)]


def counted_trials(monkeypatch) -> list[object]:
    """The overloads tried from now on (verdicts forgotten first)."""
    monkeypatch.setattr(cpu_out_check, "VERDICTS", {})
    monkeypatch.setattr(cpu_out_check, "PATTERN_VERDICTS", {})
    tried = []
    trial = cpu_out_check.trial

    def counted(out_op, *rest):  # noqa: ANN001, ANN002
        tried.append(out_op)
        return trial(out_op, *rest)

    monkeypatch.setattr(cpu_out_check, "trial", counted)
    return tried


def test_a_large_result_at_a_new_size_of_a_trusted_pattern_is_not_tried_again(
    monkeypatch,
) -> None:
    tried = counted_trials(monkeypatch)
    w = torch.randn(64, 1024)
    for rows in (300, 301, 302):  # 1.2 MiB of results each: over LARGE_TRIAL_BYTES
        x = torch.randn(rows, 64)
        assert writes_in_place(aten.mm.out, (x, w), {}, ("out",), [x @ w])
    for rows in (3, 4):  # small results are tried at every layout
        x = torch.randn(rows, 64)
        assert writes_in_place(aten.mm.out, (x, w), {}, ("out",), [x @ w])
    assert tried == [aten.mm.out] * 3
    x = torch.randn(300, 64)
    assert writes_in_place(aten.mm.out, (x.t().contiguous().t(), w), {}, ("out",), [x @ w])
    assert len(tried) == 4  # another stride order is another pattern


def test_a_pattern_that_failed_a_trial_is_tried_at_every_size(monkeypatch) -> None:
    tried = counted_trials(monkeypatch)
    for index, rows in enumerate((300, 301, 302)):  # 1.2 MiB of results each
        x = torch.randn(rows, 1024)
        recorded = x.neg() + 0.5 if index == 0 else x.neg()  # the first trial sees other bits
        assert writes_in_place(aten.neg.out, (x,), {}, ("out",), [recorded]) == (index > 0)
    assert tried == [aten.neg.out] * 3


def test_an_overload_that_tells_its_outputs_storages_apart_is_not(monkeypatch) -> None:
    # aten.linalg_qr.out takes a Q that shares R's storage for R itself and leaves R unwritten:
    # the replay's intermediates all lie in one arena, so the trial's outputs share a storage.
    monkeypatch.setattr(cpu_out_check, "VERDICTS", {})
    monkeypatch.setattr(cpu_out_check, "PATTERN_VERDICTS", {})
    a = torch.randn(4, 4)
    q, r = torch.linalg.qr(a)
    assert not writes_in_place(aten.linalg_qr.out, (a,), {}, ("Q", "R"), [q, r])


@torch.no_grad()
def test_a_factorisation_whose_outputs_the_graph_reads_replays_eagers_values() -> None:
    # Q and R are intermediates here, in the arena: before the trial put its outputs in one
    # storage, a square input replayed a stale R and a tall one raised an internal assert.
    def qr_twice(a: torch.Tensor) -> torch.Tensor:
        q, r = torch.linalg.qr(a)
        return q * 2 + r.sum()

    options = {"static_kernel_compile": False}
    fn = torch.compile(qr_twice, backend="npugraph_ex", dynamic=False, options=options)
    for rows in (4, 6):
        for _ in range(3):
            a = torch.randn(rows, 4)
            torch.testing.assert_close(fn(a), qr_twice(a))
    stats = npugraph_ex.stats()["totals"]
    assert (stats["captures"], stats["replays"], stats["eager_calls"]) == (2, 4, 0)
