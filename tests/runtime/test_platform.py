"""One platform per device type answers the device questions of passes, kernels and the compiler:
the defaults say no, the CPU's decides products from their sizes and the host probes."""

from __future__ import annotations

import pytest
import torch

from npugraph_ex.runtime.cpu import platform as cpu_platform
from npugraph_ex.runtime.cpu import probes
from npugraph_ex.runtime.devices import DEVICES, loaded
from npugraph_ex.runtime.platform import (
    FUSED_RMS_NORM,
    ONEDNN_LINEAR,
    REDUCTION,
    SDPA,
    Platform,
    Product,
    platform_for,
)

SPLIT = Product(1, 256, 128, torch.float32)
"""A one-row product by the smallest weight the CPU splits."""
LINEAR = Product(20, 512, 128, torch.float32)
"""A 20-row product by the smallest weight the CPU gives oneDNN."""


@pytest.fixture
def host_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where every probe says its rewrite pays (whatever this one measures)."""
    monkeypatch.setattr(probes, "split_pays", lambda: True)
    monkeypatch.setattr(probes, "linear_pays", lambda rows=None: True)
    monkeypatch.setattr(probes, "reduction_pays", lambda dtype=torch.float32: True)


def test_one_shared_platform_per_device_type() -> None:
    assert platform_for("cpu") is platform_for("cpu")
    assert type(platform_for("cpu")).__name__ == "CpuPlatform"
    assert type(platform_for("cuda")).__name__ == "CudaPlatform"
    assert type(platform_for("npu")).__name__ == "NpuPlatform"
    assert type(platform_for("meta")) is Platform
    assert platform_for("meta").device_type == "meta"


@pytest.mark.parametrize("device_type", ["meta", "cuda", "npu"])
def test_the_defaults_rewrite_no_product_and_specialise_no_key(
    host_pays: None, device_type: str
) -> None:
    platform = platform_for(device_type)
    assert not platform.split_pays(SPLIT, parts=2)
    assert not platform.onednn_linear_pays(LINEAR)
    assert not platform.reduction_pays(SPLIT)
    assert platform.static_kernel_products() == ()
    assert not platform.cpp_wrapper()
    assert platform.key_rule() is None
    assert platform.grouped_rows_max_positions() == 0


def test_devices_with_fused_kernels_list_what_this_torch_has() -> None:
    assert platform_for("meta").fused_kernels() == frozenset()
    for device_type in ("cpu", "cuda", "npu"):
        platform = platform_for(device_type)
        assert SDPA in platform.fused_kernels()
        assert (FUSED_RMS_NORM in platform.fused_kernels()) == platform.has_kernel(FUSED_RMS_NORM)


def test_the_cpu_splits_few_rows_by_a_large_weight_where_the_host_pays(
    host_pays: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = platform_for("cpu")
    assert cpu.split_pays(SPLIT, parts=2)
    assert not cpu.split_pays(SPLIT, parts=1)  # one block: nothing to split over
    rows = cpu_platform.SPLIT_MAX_ROWS
    assert cpu.split_pays(Product(rows, 256, 128, torch.float32), parts=2)
    assert not cpu.split_pays(Product(rows + 1, 256, 128, torch.float32), parts=2)
    assert not cpu.split_pays(Product(None, 256, 128, torch.float32), parts=2)
    assert not cpu.split_pays(Product(1, 255, 128, torch.float32), parts=2)
    assert not cpu.split_pays(Product(1, 256, 128, torch.float64), parts=2)
    monkeypatch.setattr(probes, "split_pays", lambda: False)
    assert not cpu.split_pays(SPLIT, parts=2)


def test_the_cpu_gives_onednn_large_weights_at_counts_where_it_pays(
    host_pays: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = platform_for("cpu")
    assert cpu.onednn_linear_pays(LINEAR)
    assert cpu.onednn_linear_pays(Product(None, 512, 128, torch.float32))
    assert not cpu.onednn_linear_pays(
        Product(cpu_platform.LINEAR_MIN_ROWS - 1, 512, 128, torch.float32)
    )
    assert not cpu.onednn_linear_pays(Product(20, 511, 128, torch.float32))
    assert not cpu.onednn_linear_pays(Product(20, 512, 128, torch.bfloat16))
    assert cpu_platform.LINEAR_ROW_COUNTS == {20}  # the counts given are remembered
    monkeypatch.setattr(probes, "linear_pays", lambda rows=None: rows is None or rows >= 16)
    assert not cpu.onednn_linear_pays(Product(9, 512, 128, torch.float32))
    assert cpu.onednn_linear_pays(Product(None, 512, 128, torch.float32))


def test_the_cpu_reduces_few_rows_in_static_kernels_where_the_host_pays(
    host_pays: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = platform_for("cpu")
    assert cpu.static_kernel_products() == (REDUCTION, ONEDNN_LINEAR)
    assert cpu.cpp_wrapper()
    rows = cpu_platform.REDUCTION_MAX_ROWS
    assert cpu.reduction_pays(Product(rows, 32, 64, torch.float64))
    assert cpu.reduction_pays(Product(1, 32, 64, torch.bfloat16))
    assert not cpu.reduction_pays(Product(rows + 1, 32, 64, torch.float32))
    large = cpu_platform.REDUCTION_LARGE_WEIGHT_ELEMENTS // 1024  # columns by 1024 deep
    most = cpu_platform.REDUCTION_MAX_ROWS_LARGE_WEIGHT
    assert cpu.reduction_pays(Product(most, large, 1024, torch.float32))
    assert not cpu.reduction_pays(Product(most + 1, large, 1024, torch.float32))
    assert cpu.reduction_pays(Product(rows, large - 1, 1024, torch.float32))
    assert not cpu.reduction_pays(Product(1, 32, 64, torch.int64))
    # The probe answers per dtype: ATen's float16 ``mm`` may stream the weight where its
    # bfloat16 one does not.
    monkeypatch.setattr(probes, "reduction_pays", lambda dtype: dtype != torch.float16)
    assert not cpu.reduction_pays(Product(1, 32, 64, torch.float16))
    assert cpu.reduction_pays(Product(1, 32, 64, torch.bfloat16))


def test_the_cpu_specialises_keys_with_few_rows_or_counts_onednn_is_not_given(
    host_pays: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = platform_for("cpu").key_rule()
    assert rule is not None
    few, many = cpu_platform.SPLIT_MAX_ROWS, cpu_platform.SPLIT_MAX_ROWS + 12
    assert rule([few]) and rule([None, few])
    assert not rule([many]) and not rule([None])
    monkeypatch.setattr(cpu_platform, "LINEAR_MAX_ROW_COUNTS", 0)  # oneDNN is given no count
    assert rule([many + 1])


@pytest.mark.parametrize("device_type", sorted(DEVICES))
def test_each_device_names_its_runtime_and_platform_in_one_row(device_type: str) -> None:
    from npugraph_ex.runtime import runtime_for
    from npugraph_ex.runtime.base import DeviceRuntime

    row = DEVICES[device_type]
    runtime, platform = loaded(row.runtime), loaded(row.platform)
    assert issubclass(runtime, DeviceRuntime) and issubclass(platform, Platform)
    assert type(platform_for(device_type)) is platform
    if device_type == "cpu":  # the others' runtimes need their device to be made
        assert type(runtime_for(device_type)) is runtime


def test_a_device_type_without_a_row_gets_the_default_platform_and_no_runtime() -> None:
    from npugraph_ex.errors import ConfigError
    from npugraph_ex.runtime import runtime_for

    assert type(platform_for("meta")) is Platform
    with pytest.raises(ConfigError, match="no graph runtime for device type 'meta'; supported: "):
        runtime_for("meta")
