"""A quantized-linear kernel compared with its format's torch reference kernel on the same loaded
checkpoint, and the device Triton kernels run on in tests: the interpreter on CPU tensors when
``TRITON_INTERPRET`` is set (the repository's conftest sets it on machines without a GPU), else CUDA."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
import torch

from tokenmill.plugin_api import PlatformCapabilities
from tokenmill.plugin_api.triton import TRITON_FAMILY, interpreter_enabled

INTERPRETED = interpreter_enabled()
TRITON_DEVICE = "cpu" if INTERPRETED else "cuda"

# rtol per compute dtype; atol is rtol times the reference's largest |y| (sums of many products)
KERNEL_TOLERANCE: Mapping[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}


def require_triton_device() -> None:
    """Skip the calling test unless Triton kernels can run: interpreted, or compiled on a CUDA device."""
    if not INTERPRETED and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest without a GPU) or a CUDA device")


def require_compiled_triton() -> None:
    """Skip the calling test unless Triton kernels are compiled for a CUDA device (not interpreted)."""
    if INTERPRETED or not torch.cuda.is_available():
        pytest.skip("checks compiled kernels on a CUDA device")


def assert_matches_reference(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """``got`` has ``dtype``, ``want``'s shape, and ``want``'s values within ``KERNEL_TOLERANCE``."""
    assert got.dtype == dtype and got.shape == want.shape
    tol = KERNEL_TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol * want.float().abs().max().item(), rtol=tol)


def assert_layers_agree(layer: Any, reference: Any, rows: int, dtype: torch.dtype) -> None:
    """``layer`` and ``reference`` (loaded with the same checkpoint) give the same output, within
    ``KERNEL_TOLERANCE``, for ``rows`` random activations in ``dtype`` on ``layer``'s device."""
    x = torch.randn(rows, layer.spec.in_features, device=next(layer.parameters()).device).to(dtype)
    assert_matches_reference(layer(x), reference(x), dtype)


def assert_triton_family_verdicts(kernel_cls: Any, quantizer: Any, spec: Any) -> None:
    """``kernel_cls.supports`` follows ``tokenmill.plugin_api.triton``: refused on the CPU (interpreter
    only), accepted on a device of a ``"triton"``-family platform, refused (naming the family) on a
    platform without it, whatever its device type."""
    triton_caps, plain_caps = PlatformCapabilities(families=(TRITON_FAMILY,)), PlatformCapabilities()
    cpu = kernel_cls.supports(quantizer, spec, "cpu", triton_caps)
    assert "interpreter" in cpu and "not for serving" in cpu
    assert kernel_cls.supports(quantizer, spec, "cuda", triton_caps) is None
    assert "no backend for 'mps'" in kernel_cls.supports(quantizer, spec, "mps", plain_caps)
    assert "'triton' family" in kernel_cls.supports(quantizer, spec, "cuda", plain_caps)


def loaded_layers(layer_cls: Any, spec: Any, quantizer: Any, kernels: Iterable[Any],
                  shards: Sequence[Mapping[str, torch.Tensor]], bias: torch.Tensor | None, device: str) -> list[Any]:
    """One ``layer_cls(spec, quantizer, kernel)`` per kernel, each loaded with the same checkpoint
    ``shards`` (one dict of checkpoint-named tensors per fused shard, e.g. ``x.qweight``: the last
    name component is the parameter), ``bias`` copied in, repacked and moved to ``device``."""
    layers = []
    for kernel in kernels:
        layer = layer_cls(spec, quantizer, kernel)
        for index, shard in enumerate(shards):
            for name, tensor in shard.items():
                layer.load_weight(name.rpartition(".")[2], tensor, index if len(shards) > 1 else None)
        if bias is not None:
            layer.bias.copy_(bias)
        layer.process_weights_after_loading()
        layers.append(layer.to(device))
    return layers
