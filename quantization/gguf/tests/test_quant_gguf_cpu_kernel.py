"""GGUFPackedCpuKernel: the C kernel over Q4_0/Q4_1/Q8_0 blocks in its CPU order gives the dequantized
layer's float32 product (only the rounding order differs), for decode-sized batches (two weight rows
at a time for one token) and prefill-sized ones (dequantized tiles of exactly the load-time weights
into torch's GEMM); ordering after loading rearranges the blocks in place, in the same bytes."""

from __future__ import annotations

import ctypes
import platform
import subprocess

import gguf
import numpy as np
import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities
from tokenmill.plugin_api.native import FLAGS, compiler
from tokenmill_quant_gguf.cpu_kernel import (
    DEQUANTIZE_ROWS,
    SOURCE,
    GGUFPackedCpuKernel,
    cpu_ordered,
    load_library,
    native_unavailable,
)
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


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, DEQUANTIZE_ROWS])
@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_native_rows_match_the_dequantized_weights(rows, ggml_type, rng, packed_layer):
    layer = packed_layer([(ggml_type, 70)], 576, rng)
    x = torch.randn(rows, 576)
    got = GGUFPackedCpuKernel().apply(layer, x, None)
    assert got.dtype == torch.float32 and got.shape == (rows, 70)
    torch.testing.assert_close(got.double(), dequantized_product(layer, x), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 5, DEQUANTIZE_ROWS + 1])
@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_long_rows_and_an_odd_row_count(rows, ggml_type, rng, packed_layer):
    """2080 weights a row (65 blocks: the scales widen in two chunks of at most 64 blocks) and 33
    output rows (one token takes weight rows in pairs, the last alone)."""
    layer = packed_layer([(ggml_type, 33)], 2080, rng)
    x = torch.randn(rows, 2080)
    torch.testing.assert_close(GGUFPackedCpuKernel().apply(layer, x, None).double(), dequantized_product(layer, x),
                               atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_the_cpu_order_keeps_the_bytes_and_places_each_weight(ggml_type, rng, packed_layer):
    """A row becomes its blocks' scale records, then their quant records; weight j of a 4-bit block is
    nibble j / 4 of its record's little-endian word j % 4, Q8_0's bytes keep their order."""
    layer = packed_layer([(ggml_type, 5)], 96, rng)
    raw = layer.qweight.numpy().copy()
    ordered = cpu_ordered(layer.qweight.clone(), layer.gguf_segments, 96).numpy()
    scale_bytes = 4 if ggml_type is GGMLType.Q4_1 else 2
    block_bytes = scale_bytes + (32 if ggml_type is GGMLType.Q8_0 else 16)
    assert ordered.shape == raw.shape
    for row in range(5):
        for block in range(3):
            original = raw[row, block * block_bytes:(block + 1) * block_bytes]
            scales = ordered[row, block * scale_bytes:(block + 1) * scale_bytes]
            assert bytes(scales) == bytes(original[:scale_bytes])
            record_bytes = block_bytes - scale_bytes
            record = ordered[row, 3 * scale_bytes + block * record_bytes:3 * scale_bytes + (block + 1) * record_bytes]
            quants = original[scale_bytes:]
            if ggml_type is GGMLType.Q8_0:
                assert bytes(record) == bytes(quants)
                continue
            words = record.view("<u4")
            for j in range(32):
                nibble = quants[j] & 15 if j < 16 else quants[j - 16] >> 4
                assert (words[j % 4] >> (4 * (j // 4))) & 15 == nibble


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_dequantized_tiles_are_the_load_time_weights_exactly(ggml_type, rng, packed_layer):
    layer = packed_layer([(ggml_type, 7)], 2080, rng)
    expected = dequantize(layer.qweight, ggml_type, torch.float32)
    ordered = cpu_ordered(layer.qweight.clone(), layer.gguf_segments, 2080)
    tile = torch.empty(7, 2080)
    assert load_library().dequantize(ordered.data_ptr(), ordered.stride(0), 7, 2080, int(ggml_type),
                                     tile.data_ptr()) == 0
    assert torch.equal(tile, expected)


def test_ordering_after_loading_is_in_place_once_per_load(rng, packed_layer):
    """process_weights_after_loading orders the layer's own blocks (once); an unordered layer is
    ordered into a copy on each call and left as it was; blocks loaded again in place are ordered
    again."""
    layer = packed_layer([(GGMLType.Q4_1, 64), (GGMLType.Q8_0, 32)], 96, rng)
    layer.spec = LinearSpec("model.layers.0.mlp.down_proj", 96, 96, (64, 32), False, "float32")
    x = torch.randn(3, 96)
    want = dequantized_product(layer, x)
    raw = layer.qweight.clone()
    kernel = GGUFPackedCpuKernel()
    torch.testing.assert_close(kernel.apply(layer, x, None).double(), want, atol=1e-4, rtol=1e-5)
    assert torch.equal(layer.qweight, raw)
    storage = layer.qweight.data_ptr()
    kernel.process_weights_after_loading(layer)
    kernel.process_weights_after_loading(layer)
    ordered = cpu_ordered(raw.clone(), layer.gguf_segments, 96)
    assert layer.qweight.data_ptr() == storage and torch.equal(layer.qweight, ordered)
    torch.testing.assert_close(kernel.apply(layer, x, None).double(), want, atol=1e-4, rtol=1e-5)
    layer.qweight.copy_(raw)  # the checkpoint's blocks loaded again, in place: no longer ordered
    torch.testing.assert_close(kernel.apply(layer, x, None).double(), want, atol=1e-4, rtol=1e-5)
    kernel.process_weights_after_loading(layer)
    assert torch.equal(layer.qweight, ordered)
    torch.testing.assert_close(kernel.apply(layer, x, None).double(), want, atol=1e-4, rtol=1e-5)


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


def _build_without(flags: tuple[str, ...], directory) -> ctypes.CDLL:
    """The kernel compiled with extra ``flags`` that switch ISA paths off."""
    target = directory / f"gguf_matmul{'_'.join(flags)}.so"
    result = subprocess.run([compiler(), *FLAGS, *flags, str(SOURCE), "-o", str(target), "-lm"], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"this compiler cannot build without {flags}: {result.stderr[-200:]}")
    library = ctypes.CDLL(str(target))
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    library.gguf_matmul_f32.argtypes = [pointer, i64, i64, pointer, i64, i64, ctypes.c_int, pointer, i64]
    library.gguf_dequantize_f32.argtypes = [pointer, i64, i64, i64, ctypes.c_int, pointer]
    return library


@pytest.fixture(scope="module", params=[("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")],
                ids=["avx2-path", "portable-path"])
def narrower_build(request, tmp_path_factory) -> ctypes.CDLL:
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the ISA paths switched off here are x86's")
    return _build_without(request.param, tmp_path_factory.mktemp("isa"))


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_every_isa_path_reads_the_cpu_order(narrower_build, ggml_type, rng, packed_layer):
    """The AVX2 and the portable paths (built here with the wider ISAs switched off) give the same
    products as the dequantized weights, and dequantize to exactly the load-time weights."""
    library = narrower_build
    layer = packed_layer([(ggml_type, 33)], 2080, rng)
    ordered = cpu_ordered(layer.qweight.clone(), layer.gguf_segments, 2080)
    for rows in (1, 3):
        x = torch.randn(rows, 2080)
        y = torch.empty(rows, 33)
        assert library.gguf_matmul_f32(x.data_ptr(), rows, 2080, ordered.data_ptr(), ordered.stride(0), 33,
                                       int(ggml_type), y.data_ptr(), 33) == 0
        torch.testing.assert_close(y.double(), dequantized_product(layer, x), atol=1e-3, rtol=1e-5)
    tile = torch.empty(33, 2080)
    assert library.gguf_dequantize_f32(ordered.data_ptr(), ordered.stride(0), 33, 2080, int(ggml_type),
                                       tile.data_ptr()) == 0
    assert torch.equal(tile, dequantize(layer.qweight, ggml_type, torch.float32))
