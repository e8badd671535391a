"""The gguf-packed-triton kernel against the packed torch reference: Q8_0, Q4_0 and Q4_1 blocks,
fused shards of mixed types padded to the widest row, three compute dtypes, a real GGUF file
through the quantizer; on the CPU through Triton's interpreter (small shapes), on a GPU with
larger ones."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gguf.dequantized_kernel import GGUFDequantizedKernel
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.packed_kernel import GGUFPackedTorchKernel
from tokenmill_quant_gguf.quantizer import GGUFQuantizer
from tokenmill_quant_gguf.triton_kernel import GGUFPackedTritonKernel
from tokenmill_testkit import kernel_comparison as comparison
from tokenmill_testkit.kernel_comparison import (
    assert_matches_reference,
    require_compiled_triton,
    require_triton_device,
)

DEVICE = comparison.TRITON_DEVICE
TRITON_CAPS = PlatformCapabilities(families=("triton",))
T = gguf.GGMLQuantizationType


def _assert_matches_reference(layer: SimpleNamespace, in_features: int, rows: int, dtype: torch.dtype) -> None:
    x = torch.randn(rows, in_features, device=layer.qweight.device).to(dtype)
    want = GGUFPackedTorchKernel().apply(layer, x, None)
    assert_matches_reference(GGUFPackedTritonKernel().apply(layer, x, None), want, dtype)


@pytest.fixture(autouse=True)
def _triton_device():
    require_triton_device()


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("ggml_type", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1])
def test_block_types_match_the_torch_reference(rows, ggml_type, rng, packed_layer):
    _assert_matches_reference(packed_layer([(ggml_type, 96)], 128, rng, DEVICE), 128, rows, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_activations(dtype, rng, packed_layer):
    _assert_matches_reference(packed_layer([(GGMLType.Q4_1, 64)], 128, rng, DEVICE), 128, 5, dtype)


def test_fused_shards_of_mixed_types_with_padded_rows(rng, packed_layer):
    """Q4_0 rows (18-byte blocks) padded to Q8_0's width (34-byte blocks), then Q4_1 rows."""
    layer = packed_layer([(GGMLType.Q4_0, 96), (GGMLType.Q8_0, 40), (GGMLType.Q4_1, 72)], 96, rng, DEVICE)
    _assert_matches_reference(layer, 96, 33, torch.float32)


def _smollm_like_file(gguf_fixtures, rng, v_type=T.Q8_0) -> str:
    shapes = {"attn_q": (128, 128), "attn_k": (64, 128), "attn_v": (64, 128)}
    types = {"attn_q": T.Q4_1, "attn_k": T.Q4_1, "attn_v": v_type}
    tensors = {f"blk.0.{stem}.weight": (gguf_fixtures.encode(rng.standard_normal(shape).astype(np.float32),
                                                             types[stem], rng), types[stem])
               for stem, shape in shapes.items()}
    return gguf_fixtures.write(tensors, metadata={"llama.attention.head_count": 2, "llama.attention.head_count_kv": 1})


QKV = LinearSpec("model.layers.0.self_attn.qkv_proj", 128, 256, (128, 64, 64), True, "float32")


def test_real_file_through_the_quantizer(gguf_fixtures, rng):
    """A packed fused qkv layer loaded from a GGUF file the way the model loader does."""
    quantizer = GGUFQuantizer(_smollm_like_file(gguf_fixtures, rng), "packed")
    layers = [Linear(QKV, quantizer, kernel) for kernel in (GGUFPackedTritonKernel(), GGUFPackedTorchKernel())]
    weights = dict(quantizer.weights(quantizer._checkpoint.path))  # packed names once the layers exist
    for layer in layers:
        for index, module in enumerate(("q_proj", "k_proj", "v_proj")):
            layer.load_weight("qweight", weights[f"model.layers.0.self_attn.{module}.qweight"], index)
        layer.bias.copy_(torch.arange(256.0) / 256)
        layer.to(DEVICE)
    assert layers[0].gguf_segments == ((0, 192, GGMLType.Q4_1), (192, 256, GGMLType.Q8_0))
    x = torch.randn(2, 5, 128, device=DEVICE)
    torch.testing.assert_close(layers[0](x), layers[1](x), atol=1e-4, rtol=1e-4)


def test_kernel_order_and_verdicts(gguf_fixtures, rng):
    caps = TRITON_CAPS
    packed = GGUFQuantizer(_smollm_like_file(gguf_fixtures, rng), "packed")
    assert packed.kernels()[:3] == (GGUFDequantizedKernel, GGUFPackedTritonKernel, GGUFPackedTorchKernel)
    # only where a platform prefers it
    assert [k.name for k in packed.kernels()[3:]] == ["gguf-packed-cpu"]
    comparison.assert_triton_family_verdicts(GGUFPackedTritonKernel, packed, QKV)
    dequantize = GGUFQuantizer(packed._checkpoint.path, "dequantize")
    assert "pinned to dequantize" in GGUFPackedTritonKernel.supports(dequantize, QKV, "cuda", caps)
    k_quant = GGUFQuantizer(_smollm_like_file(gguf_fixtures, rng, v_type=T.Q5_0), "packed")
    assert GGUFPackedTritonKernel.supports(k_quant, QKV, "cuda", caps) == (
        "Q5_0 blocks: this kernel reads Q8_0, Q4_0, Q4_1 only")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 100, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_large_layers(rows, dtype, packed_layer):
    require_compiled_triton()
    layer = packed_layer([(GGMLType.Q4_0, 2048), (GGMLType.Q8_0, 512), (GGMLType.Q4_1, 512)], 2048,
                          np.random.default_rng(0), device="cuda")
    _assert_matches_reference(layer, 2048, rows, dtype)
