"""What pays on a device, in one object per device type: the tuning answers passes, kernels and
the compiler use where a choice depends on the device. How a device captures, stages and replays
is its runtime's (``base.DeviceRuntime``: where a key's input buffers are made, warm-up before a
capture, whether replays re-run core limits or can be watched node by node, which stream is the
device's default, what loading compiled kernels needs to know of the host); both are named in
one row of ``devices.DEVICES``.

The stages above ``runtime/`` are device-free. Where one of them would pick an optimisation by
device (whether a rewrite of a matrix product pays, which fused kernels a pattern may put in,
whether keys of a graph with symbolic sizes get kernels of their own), it asks the platform of the
tensors' device type and uses the value it returns:

    before: if x.device.type == "cpu" and rows <= 8 and split_pays(): ...      (in a pattern)
    after:  if platform_for(x.device.type).split_pays(Product(rows, n, k, dtype), parts): ...

Each answer of ``Platform`` is the default a device gets unless its platform says otherwise: no
rewrite of a product pays, no fused kernel is put in, keys run the graph as compiled, Inductor's
own decompositions and wrapper. The CPU's platform (``runtime/cpu/platform.py``) holds the product
decisions and the host probes behind them; CUDA's and the NPU's (in ``cuda.py``,
``npu.py``) the fused kernels. A device type without a platform of its own (``meta``, or
one no runtime serves) gets the defaults: a pass may see its tensors, and its questions have an
answer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from npugraph_ex.runtime.devices import DEVICES, loaded

SDPA = "aten::scaled_dot_product_attention"
"""Attention as one kernel, which the eager-attention pattern puts in for the written-out ops."""
FUSED_RMS_NORM = "aten::_fused_rms_norm"
"""RMSNorm as one kernel, which the RMSNorm pattern puts in for the written-out norm."""
FUSED_KERNELS = (SDPA, FUSED_RMS_NORM)

REDUCTION = "reduction"
"""A static kernel's few-row product as a multiply-and-sum (``kernels/decompositions``)."""
ONEDNN_LINEAR = "onednn_linear"
"""A static kernel's product by a weight as a call of oneDNN's linear kernel."""

KeyRule = Callable[[Sequence[int | None], bool], bool]
"""Given the row counts of a key's products (None: not known from its inputs) and whether the
graph runs some of them through oneDNN's linear kernel, whether the key runs its products with
the kernels chosen for its own sizes (``capture/key_shapes``)."""


@dataclass(frozen=True)
class Product:
    """A matrix product by a linear layer's weight, ``x @ w.t()``, as plain values: ``x`` of
    ``rows`` rows and ``depth`` columns, ``w`` of ``outputs`` rows and ``depth`` columns, both
    of ``dtype``."""

    rows: int | None
    """None where symbolic (a graph compiled with ``dynamic=True``): a question compares only
    plain ints, as comparing a symbolic size would add a guard."""
    outputs: int
    depth: int
    dtype: torch.dtype

    @property
    def weight_elements(self) -> int:
        return self.outputs * self.depth


class Platform:
    """The questions, each answered with a value; the defaults answer no (or None)."""

    device_type = ""
    dispatch_key: str | None = None
    """The dispatch key whose kernels run this device's tensors (None: not known here)."""

    def __init__(self, device_type: str | None = None) -> None:
        if device_type is not None:
            self.device_type = device_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device_type!r})"

    def split_pays(self, product: Product, parts: int) -> bool:
        """Whether ``product`` runs faster with its weight's rows cut into ``parts`` blocks, one
        per intra-op thread, as a batched product (``passes/patterns/row_products``, and at
        capture ``capture/key_shapes``)."""
        return False

    def onednn_linear_pays(self, product: Product) -> bool:
        """Whether ``product`` runs through oneDNN's linear kernel from the plain weight
        (``passes/patterns/onednn_linear``; ``kernels/decompositions`` through it). A yes for a
        plain row count may be remembered (a kernel that keeps code per shape given)."""
        return False

    def reduction_pays(self, product: Product) -> bool:
        """Whether ``product`` becomes a multiply-and-sum in a static kernel, where
        ``static_kernel_products`` holds ``REDUCTION`` (``kernels/decompositions``)."""
        return False

    def static_kernel_products(self) -> tuple[str, ...]:
        """The forms a matrix product of a key's static kernels may take, in the order tried,
        each where its own question takes the product (``REDUCTION``, ``ONEDNN_LINEAR``);
        empty: Inductor's own decompositions, untouched (``kernels/decompositions``)."""
        return ()

    def grouped_rows_max_positions(self) -> int:
        """Most query positions at which the query heads that share a key head run as that
        head's query rows, a plain attention over the key heads, rather than as ``enable_gqa``
        reads them (``passes/patterns/gqa_attention``); 0: never."""
        return 0

    def cpp_wrapper(self) -> bool:
        """Whether Inductor generates a key's static kernels with its C++ wrapper
        (``kernels/static_compile``)."""
        return False

    def fused_kernels(self) -> frozenset[str]:
        """The fused kernels (``SDPA``, ``FUSED_RMS_NORM``) that patterns may put in for the ops
        they replace on this device (``passes/patterns/eager_attention``, ``rms_norm``)."""
        return frozenset()

    def kernel_tier(self) -> bool | str:
        """``static_kernel_compile`` where the user left it unset: False (the ATen replay) until
        a device's benchmarks show a kernel tier paying there."""
        return False

    def host_decisions(self) -> dict[str, Any]:
        """What this host's probes measured and decided, for a benchmark's record of where it
        ran; none by default."""
        return {}

    def measured_answers(self) -> dict[Any, Any]:
        """What this process has measured of the host so far, in a form ``take_measured_
        answers`` takes: sent with each request to a compile process; none by default."""
        return {}

    def take_measured_answers(self, answers: dict[Any, Any]) -> None:
        """In a compile process: the serving process's ``measured_answers``, so that its
        compiles choose what pays as the serving process, which runs them, would."""
        return None

    def key_rule(self) -> KeyRule | None:
        """How keys of a graph with symbolic product row counts are specialised: the rule that
        picks the keys that get their own product kernels, or None where every key runs the
        graph as compiled (asked by ``compiler.key_specialiser``)."""
        return None

    def has_kernel(self, op: str) -> bool:
        """Whether the installed PyTorch has a kernel of ``op`` (``"aten::name"``) for this
        device's dispatch key, rather than a composite of other ops."""
        return self.dispatch_key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
            op, self.dispatch_key
        )

    def kernels_present(self) -> frozenset[str]:
        """``SDPA`` (every device runs it, fused where it can), and each other fused kernel the
        installed PyTorch has for this device: what a device whose fused kernels pay answers."""
        return frozenset(op for op in FUSED_KERNELS if op == SDPA or self.has_kernel(op))


@functools.cache
def platform_for(device_type: str) -> Platform:
    """The platform of ``device_type`` (one shared instance per type, a row of ``DEVICES``;
    device modules load on first use): the defaults for a type without one."""
    if device_type not in DEVICES:
        return Platform(device_type)
    return loaded(DEVICES[device_type].platform)()
