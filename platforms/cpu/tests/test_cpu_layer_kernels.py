"""CpuLayerKernels against core's PyTorch layers (the ``model_harness`` fixture's ``torch_layer``): RMSNorm
(with and without the residual add), rotary
(full and partial, on the strided q/k views a fused qkv projection gives), SiluAndMul (float32 and
bfloat16) and row gathers (embeddings, rotary angles), at decode and prefill row counts; unsupported
inputs are declined; the platform hands them to the model."""

from __future__ import annotations

import pytest
import torch

from tokenmill_cpu.layer_kernels import CpuLayerKernels, layer_ops_unavailable
from tokenmill_cpu.onednn_linear import OneDnnLinearKernel
from tokenmill_cpu.platform import LAYER_KERNELS_ENV, CpuPlatform

pytestmark = pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the layer kernels")
ROWS = (1, 3, 64)  # 64 takes the OpenMP path


@pytest.fixture(scope="module")
def kernels() -> CpuLayerKernels:
    return CpuLayerKernels()


@pytest.mark.parametrize("count", ROWS)
def test_rms_norm_matches_torch(kernels, model_harness, count):
    torch.manual_seed(count)
    norm = model_harness.torch_layer("rms_norm", 576, 1e-5)
    norm.weight.data.normal_()
    x, residual = torch.randn(count, 576) * 3, torch.randn(count, 576)
    torch.testing.assert_close(kernels.rms_norm(x, norm.weight, norm.eps), norm(x), rtol=1e-6, atol=1e-6)
    normed, total = kernels.rms_norm(x, norm.weight, norm.eps, residual)
    want_normed, want_total = norm(x, residual)
    assert torch.equal(total, want_total)  # the residual add is the same float operation
    torch.testing.assert_close(normed, want_normed, rtol=1e-6, atol=1e-6)


def test_rms_norm_of_per_head_rows(kernels, model_harness):
    norm = model_harness.torch_layer("rms_norm", 64, 1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    heads = torch.randn(5, 9, 64)
    got = kernels.rms_norm(heads, norm.weight, norm.eps)
    assert got.shape == heads.shape
    torch.testing.assert_close(got, norm(heads), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("count", ROWS)
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_is_bitwise_torch_on_fused_qkv_views(kernels, model_harness, count, rotary_dim):
    torch.manual_seed(rotary_dim)
    q, k, _ = torch.randn(count, 576 + 2 * 192).split((576, 192, 192), dim=-1)
    q, k = q.view(count, 9, 64), k.view(count, 3, 64)
    cos, sin = torch.randn(count, 1, rotary_dim // 2), torch.randn(count, 1, rotary_dim // 2)
    angles = model_harness.torch_layer("rotary_angles", cos, sin, rotary_dim)
    got_q, got_k = kernels.rotary(q, k, cos, sin)
    want_q, want_k = angles.apply(q, k)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(model_harness.torch_layer("rotary_angles", cos, sin, rotary_dim, kernels).apply(q, k)[0], want_q)


@pytest.mark.parametrize("count", ROWS)
def test_silu_and_mul_matches_torch(kernels, model_harness, count):
    torch.manual_seed(count)
    x = torch.randn(count, 2 * 1536) * 6
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # the exp clamp at both ends, and zero
    want = model_harness.torch_layer("silu_and_mul")(x)
    got = kernels.silu_and_mul(x)
    torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-30)


def _within_one_bfloat16_step(got: torch.Tensor, want: torch.Tensor) -> None:
    """got equals want but where a float32 sum or exp rounded the other way: then by one bfloat16 step."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    steps = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) < 0.02


@pytest.mark.parametrize("count", ROWS)
def test_bfloat16_rms_norm_rounds_where_torch_does(kernels, model_harness, count):
    torch.manual_seed(count)
    norm = model_harness.torch_layer("rms_norm", 576, 1e-5, dtype=torch.bfloat16)
    norm.weight.data.normal_()
    x, residual = (torch.randn(count, 576) * 3).bfloat16(), torch.randn(count, 576).bfloat16()
    _within_one_bfloat16_step(kernels.rms_norm(x, norm.weight, norm.eps), norm(x))
    normed, total = kernels.rms_norm(x, norm.weight, norm.eps, residual)
    want_normed, want_total = norm(x, residual)
    assert torch.equal(total, want_total)
    _within_one_bfloat16_step(normed, want_normed)


@pytest.mark.parametrize("count", ROWS)
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_bfloat16_rotary_is_bitwise_torch(kernels, model_harness, count, rotary_dim):
    torch.manual_seed(rotary_dim + count)
    q, k, _ = torch.randn(count, 576 + 2 * 192).bfloat16().split((576, 192, 192), dim=-1)
    q, k = q.view(count, 9, 64), k.view(count, 3, 64)
    cos, sin = (torch.randn(count, 1, rotary_dim // 2).bfloat16() for _ in range(2))
    got_q, got_k = kernels.rotary(q, k, cos, sin)
    want_q, want_k = model_harness.torch_layer("rotary_angles", cos, sin, rotary_dim).apply(q, k)
    assert got_q.dtype == torch.bfloat16 and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("count", ROWS)
def test_bfloat16_silu_and_mul_rounds_where_torch_does(kernels, model_harness, count):
    torch.manual_seed(count)
    x = (torch.randn(count, 2 * 1536) * 6).bfloat16()
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    _within_one_bfloat16_step(kernels.silu_and_mul(x), model_harness.torch_layer("silu_and_mul")(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_gather_rows_is_indexing(kernels, dtype):
    table = (torch.randn(50, 24) * 100).to(dtype)
    indices = torch.tensor([3, 0, 49, 3, 17], dtype=torch.int64)
    got = kernels.gather_rows(table, indices)
    assert got.dtype == dtype and torch.equal(got, table[indices])
    assert kernels.gather_rows(table, indices[:0]).shape == (0, 24)


def test_gather_rows_refuses_indices_outside_the_table(kernels):
    table = torch.randn(10, 8)
    for bad in (10, -1):
        with pytest.raises(IndexError, match="out of range for a table of 10 rows"):
            kernels.gather_rows(table, torch.tensor([1, bad]))


def test_embedding_and_rotary_angles_gather_through_the_kernels(kernels, model_harness):
    from transformers import LlamaConfig


    embedding = model_harness.torch_layer("embedding", 40, 16, dtype=torch.float32)
    embedding.weight.data.normal_()
    ids = torch.tensor([7, 39, 0, 7])
    plain = embedding(ids)
    embedding.kernels = kernels
    assert torch.equal(embedding(ids), plain)
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    rotary = model_harness.torch_layer("rotary", config, 16)
    positions = torch.tensor([0, 5, 63])
    want = rotary.angles(positions, torch.float32)
    rotary.kernels = kernels
    got = rotary.angles(positions, torch.float32)
    assert torch.equal(got.cos, want.cos) and torch.equal(got.sin, want.sin) and got.cos.shape == (3, 1, 8)


def test_unsupported_inputs_are_declined(kernels):
    weight = torch.ones(8, dtype=torch.float16)
    assert kernels.rms_norm(torch.randn(2, 8, dtype=torch.float16), weight, 1e-5) is None
    assert kernels.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), weight.float(), 1e-5) is None  # dtypes differ
    assert kernels.silu_and_mul(torch.randn(4, 8).t()) is None  # columns are not contiguous
    assert kernels.silu_and_mul(torch.randn(2, 7)) is None  # no (gate, up) halves
    q = torch.randn(2, 4, 16).transpose(0, 1)  # heads not contiguous within a row
    assert kernels.rotary(q, torch.randn(4, 2, 16), torch.randn(4, 1, 8), torch.randn(4, 1, 8)) is None
    assert kernels.rotary(torch.randn(2, 4, 16), torch.randn(2, 2, 16), torch.randn(2, 1, 16),
                          torch.randn(2, 1, 16)) is None  # rotary_dim above head_size
    assert kernels.gather_rows(torch.randn(8, 4).t(), torch.tensor([1])) is None  # rows not contiguous
    assert kernels.gather_rows(torch.randn(8, 4), torch.tensor([1], dtype=torch.int32)) is None
    assert kernels.gather_rows(torch.randn(8, 4), torch.tensor([[1]])) is None


def test_the_platform_hands_the_kernels_to_the_model(monkeypatch, model_harness):
    from transformers import LlamaConfig


    platform = CpuPlatform()
    assert isinstance(platform.layer_kernels(), CpuLayerKernels)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model, _ = model_harness.build(config, platform=platform)
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm.kernels, CpuLayerKernels)
    assert isinstance(layer.mlp.act.kernels, CpuLayerKernels)
    assert isinstance(model.model.rotary.kernels, CpuLayerKernels)
    assert isinstance(model.model.embed_tokens.kernels, CpuLayerKernels)
    assert isinstance(layer.mlp.down_proj.kernel, OneDnnLinearKernel)
    monkeypatch.setenv(LAYER_KERNELS_ENV, "0")
    assert platform.layer_kernels() is None
