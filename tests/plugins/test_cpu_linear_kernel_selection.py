"""Core's kernel selection with the CPU platform's ``linear_kernels``: oneDNN linear is offered for plain
float weights and chosen for float32 and bfloat16 full-precision layers, core's torch kernel otherwise."""

from __future__ import annotations

import pytest

from tokenmill.discovery import KernelTarget, select_kernel
from tokenmill.plugin_api import LinearSpec
from tokenmill.reference.unquantized import TorchLinearKernel, Unquantized

onednn_linear = pytest.importorskip("tokenmill_cpu.onednn_linear")
from tokenmill_cpu.platform import CpuPlatform  # noqa: E402

OneDnnLinearKernel = onednn_linear.OneDnnLinearKernel
pytestmark = pytest.mark.skipif(onednn_linear.onednn_unavailable() is not None, reason="no oneDNN in this torch build")


def test_the_platform_offers_it_and_prefers_it_for_plain_weights(monkeypatch):
    monkeypatch.setenv("TOKENMILL_CPU_LAYER_KERNELS", "0")
    platform = CpuPlatform()
    (offered,) = platform.linear_kernels()
    assert issubclass(offered, OneDnnLinearKernel) and platform.linear_kernels() == (offered,)
    target = KernelTarget.of(platform)
    spec = LinearSpec("model.layers.0.mlp.down_proj", 16, 24, (24,), False, "float32")
    choice = select_kernel(Unquantized(), spec, target)
    assert choice.kernel is offered and choice.name == "onednn-linear (full precision)"
    half = select_kernel(Unquantized(), LinearSpec("o", 16, 24, (24,), False, "float16"), target)
    assert half.kernel is TorchLinearKernel
    assert [r.render() for r in half.rejections] == ["onednn-linear: dtype float16 not supported (supports "
                                                     "float32, bfloat16)"]
    assert offered()._small_batch is None  # TOKENMILL_CPU_LAYER_KERNELS=0: oneDNN at every row count
