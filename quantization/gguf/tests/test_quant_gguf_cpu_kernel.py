"""GGUFPackedCpuKernel: the C kernel over raw Q4_0/Q4_1/Q8_0 blocks gives the dequantized layer's
float32 product (only the rounding order differs), for decode-sized and prefill-sized batches."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill_quant_gguf.cpu_kernel import GGUFPackedCpuKernel, native_unavailable
from tokenmill_quant_gguf.dequantize import dequantize
from tokenmill_quant_gguf.ggml_type import GGMLType
from tokenmill_quant_gguf.quantizer import GGUFQuantizer

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason=f"{native_unavailable()}")


def dequantized_product(layer, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` in float64 with ``W`` dequantized from the same blocks (the exact answer)."""
    in_features = x.shape[-1]
    weights = [dequantize(layer.qweight[first:end, : t.row_bytes(in_features)], t, torch.float32)
               for first, end, t in layer.gguf_segments]
    return x.double() @ torch.cat(weights).double().T


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_native_rows_match_the_dequantized_weights(rows, ggml_type, rng, packed_layer):
    layer = packed_layer([(ggml_type, 70)], 576, rng)
    x = torch.randn(rows, 576)
    got = GGUFPackedCpuKernel().apply(layer, x, None)
    assert got.dtype == torch.float32 and got.shape == (rows, 70)
    torch.testing.assert_close(got.double(), dequantized_product(layer, x), atol=1e-4, rtol=1e-5)


def test_fused_mixed_shards_bias_and_leading_dims(rng, packed_layer):
    """Q4_1 rows, Q8_0 rows padded wider, Q4_0 rows: one C call per segment into its columns."""
    layer = packed_layer([(GGMLType.Q4_1, 64), (GGMLType.Q8_0, 32), (GGMLType.Q4_0, 32)], 96, rng)
    x, bias = torch.randn(2, 3, 96), torch.randn(128)
    got = GGUFPackedCpuKernel().apply(layer, x, bias)
    want = dequantized_product(layer, x.reshape(-1, 96)) + bias.double()
    torch.testing.assert_close(got.reshape(-1, 128).double(), want, atol=1e-4, rtol=1e-5)


def test_prefill_sized_batches_and_half_activations(rng, packed_layer):
    """Eight tokens per pass over the weights, the remainder last; bfloat16 activations are computed
    in float32 and rounded back."""
    layer = packed_layer([(GGMLType.Q4_1, 48)], 64, rng)
    x = torch.randn(203, 64)
    torch.testing.assert_close(GGUFPackedCpuKernel().apply(layer, x, None).double(), dequantized_product(layer, x),
                               atol=1e-4, rtol=1e-5)
    half = GGUFPackedCpuKernel().apply(layer, x.bfloat16(), None)
    assert half.dtype == torch.bfloat16
    want = dequantized_product(layer, x.bfloat16().float())
    assert torch.equal(half, GGUFPackedCpuKernel().apply(layer, x.bfloat16().float(), None).bfloat16())
    torch.testing.assert_close(half.double(), want, atol=1e-2, rtol=1e-2)


def test_verdicts(gguf_fixtures, rng):
    caps = PlatformCapabilities()
    spec = LinearSpec("model.layers.0.self_attn.q_proj", 64, 32, (32,), False, "float32")
    path = gguf_fixtures.write({"blk.0.attn_q.weight": (gguf_fixtures.encode(
        rng.standard_normal((32, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q5_0, rng),
        gguf.GGMLQuantizationType.Q5_0)}, metadata={"llama.attention.head_count": 1})
    k_quant = GGUFQuantizer(path, "packed")
    assert "Q5_0 are not read by the C kernel" in GGUFPackedCpuKernel.supports(k_quant, spec, "cpu", caps)
    assert "not cuda" in GGUFPackedCpuKernel.supports(k_quant, spec, "cuda", caps)
    assert "pinned to dequantize" in GGUFPackedCpuKernel.supports(GGUFQuantizer(path, "dequantize"), spec, "cpu", caps)
    float64 = LinearSpec(spec.prefix, 64, 32, (32,), False, "float64")
    assert "float32, bfloat16, float16 activations only" in GGUFPackedCpuKernel.supports(k_quant, float64, "cpu", caps)
