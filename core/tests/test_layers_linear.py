"""Linear layers: fused-shard loading (output_dim, pack_factor, per_shard, weight_loader), kernel
selection with reasons, the build context, embeddings and the LM head."""

import pytest
import torch
from torch import nn

from tokenmill.discovery import KernelTarget, SelectionError, select_kernel
from tokenmill.layers.context import AttentionSpecError, ModelBuildContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel
from tokenmill.plugin_api.linear import Linear, load_shard
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.platform import ReferencePlatform
from tokenmill.reference.unquantized import TorchLinearKernel, Unquantized


class Int4DotKernel(QuantKernel):
    name = "toy-int4-dot"

    @classmethod
    def supports(cls, quantizer, spec, device_type, caps):
        return None if caps.int4_dot else "needs int4 dot products"


class UnpackKernel(QuantKernel):
    """Unpacks two 4-bit values per int8 along the output dim and multiplies."""

    name = "toy-unpack"

    def apply(self, layer, x, bias):
        low, high = layer.qweight & 0xF, (layer.qweight >> 4) & 0xF
        codes = torch.stack((low, high), dim=1).reshape(-1, layer.qweight.shape[1])
        shard_of_row = torch.repeat_interleave(torch.arange(3), torch.tensor(layer.spec.output_sizes))
        weight = (codes.float() - 8) * layer.scales[shard_of_row, None]
        return nn.functional.linear(x, weight, bias)


class ToyPacked(Quantizer):
    """A 4-bit format: ``qweight`` [out / 2, in] int8 packed along the output dim, one scale per
    fused shard, and a ``g_idx`` that every shard carries identically."""

    name = "toy-packed"

    def kernels(self):
        return (Int4DotKernel, UnpackKernel)

    def is_quantized(self, spec):
        return not spec.prefix.endswith("lm_head")

    def create_weights(self, layer, spec):
        qweight = nn.Parameter(torch.zeros(spec.out_features // 2, spec.in_features, dtype=torch.int32),
                               requires_grad=False)
        qweight.output_dim, qweight.pack_factor = 0, 2
        scales = nn.Parameter(torch.zeros(len(spec.output_sizes)), requires_grad=False)
        scales.per_shard = True
        g_idx = nn.Parameter(torch.zeros(spec.in_features, dtype=torch.int32), requires_grad=False)
        layer.register_parameter("qweight", qweight)
        layer.register_parameter("scales", scales)
        layer.register_parameter("g_idx", g_idx)


def pack(codes):
    """[out, in] 4-bit codes -> [out / 2, in]: row pairs (2i, 2i + 1) in the low / high nibble."""
    return codes[0::2] | (codes[1::2] << 4)


def test_fused_unquantized_shards_land_in_place():
    build = ModelBuildContext()
    layer = build.linear("model.layers.0.self_attn.qkv_proj", 6, (8, 4, 4), bias=True)
    assert layer.weight.shape == (16, 6) and layer.weight.output_dim == 0 and layer.bias.output_dim == 0
    parts = [torch.randn(n, 6) for n in (8, 4, 4)]
    biases = [torch.randn(n) for n in (8, 4, 4)]
    for i in (2, 0, 1):
        layer.load_weight("weight", parts[i].double(), i)  # dtype converted on copy
        layer.load_weight("bias", biases[i], i)
    x = torch.randn(3, 6)
    want = torch.cat([nn.functional.linear(x, w, b) for w, b in zip(parts, biases, strict=True)], dim=-1)
    torch.testing.assert_close(layer(x), want)
    assert layer.weight.dtype == torch.float32


def test_packed_and_per_shard_parameters():
    build = ModelBuildContext(quantizer=ToyPacked())
    layer = build.linear("qkv_proj", 4, (8, 4, 4))
    assert build.kernel_choices["qkv_proj"].kernel is UnpackKernel
    gen = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 16, (n, 4), generator=gen, dtype=torch.int32) for n in (8, 4, 4)]
    scales = [0.5, 0.25, 2.0]
    g_idx = torch.arange(4, dtype=torch.int32)
    for i in range(3):
        layer.load_weight("qweight", pack(codes[i]), i)
        layer.load_weight("scales", torch.tensor(scales[i]), i)
        layer.load_weight("g_idx", g_idx, i)
    assert torch.equal(layer.qweight[4:6], pack(codes[1]))  # shard 1 starts at row 8 / pack 2
    assert layer.scales.tolist() == scales
    x = torch.randn(2, 4)
    want = torch.cat([nn.functional.linear(x, (c.float() - 8) * s) for c, s in zip(codes, scales, strict=True)], -1)
    torch.testing.assert_close(layer(x), want)


def test_shard_shape_mismatch_and_pack_misalignment_are_reported():
    layer = ModelBuildContext(quantizer=ToyPacked()).linear("gate_up_proj", 4, (6, 6))
    with pytest.raises(ValueError, match=r"shape \(4, 4\) does not fit the parameter's \(3, 4\) \(shard 1\)"):
        layer.load_weight("qweight", torch.zeros(4, 4, dtype=torch.int32), 1)
    odd = ModelBuildContext(quantizer=ToyPacked()).linear("qkv", 4, (3, 3))
    with pytest.raises(ValueError, match="pack factor 2"):
        odd.load_weight("qweight", torch.zeros(1, 4, dtype=torch.int32), 1)
    with pytest.raises(KeyError, match="no parameter 'missing'"):
        layer.load_weight("missing", torch.zeros(1), 0)


def test_custom_weight_loader_takes_over():
    seen = []
    param = nn.Parameter(torch.zeros(2), requires_grad=False)
    param.weight_loader = lambda p, t, shard: seen.append((p is param, t.tolist(), shard))
    load_shard(param, torch.ones(3), 1, (2, 2))
    assert seen == [(True, [1.0, 1.0, 1.0], 1)] and param.sum() == 0


def _cpu(caps=None, preference=(), linear_kernels=()):
    return KernelTarget("cpu", "cpu", caps or PlatformCapabilities(), preference, linear_kernels)


def test_kernel_selection_records_reasons_and_honours_preference():
    spec = LinearSpec("model.layers.0.mlp.down_proj", 8, 8, (8,), False, "float32")
    choice = select_kernel(ToyPacked(), spec, _cpu())
    assert choice.kernel is UnpackKernel and not choice.full_precision
    assert [r.render() for r in choice.rejections] == ["toy-int4-dot: needs int4 dot products"]
    fast = select_kernel(ToyPacked(), spec, _cpu(PlatformCapabilities(int4_dot=True)))
    assert fast.kernel is Int4DotKernel and fast.rejections == ()
    preferred = select_kernel(ToyPacked(), spec, _cpu(PlatformCapabilities(int4_dot=True), ("toy-unpack",)))
    assert preferred.kernel is UnpackKernel


def test_no_kernel_error_lists_every_reason():
    class OnlyFast(ToyPacked):
        def kernels(self):
            return (Int4DotKernel,)

    spec = LinearSpec("model.layers.3.self_attn.o_proj", 8, 8, (8,), False, "float32")
    with pytest.raises(SelectionError, match=r"o_proj \[8 -> 8, float32\] on cpu:\n  - toy-int4-dot: needs int4 dot"):
        select_kernel(OnlyFast(), spec, _cpu())


class PlatformLinear(TorchLinearKernel):
    """A platform's own kernel for plain float weights (here: F.linear, rejecting bfloat16)."""

    name = "platform-linear"

    @classmethod
    def supports(cls, quantizer, spec, device_type, caps):
        return "float32 only" if spec.dtype != "float32" else None


class DequantizedKernel(TorchLinearKernel):
    """A format's kernel for layers it dequantizes at load, with the layout its format reads."""

    name = "toy-dequantized"
    layout = "dequantize"

    @classmethod
    def supports(cls, quantizer, spec, device_type, caps):
        return "pinned to packed" if quantizer.packed else None


class Dequantizing(ToyPacked):
    name = "toy-dequantizing"
    packed = False

    def kernels(self):
        return (DequantizedKernel, UnpackKernel)


def test_platform_linear_kernels_run_full_precision_layers_where_preferred():
    head = LinearSpec("lm_head", 8, 32, (32,), False, "float32")
    offered = select_kernel(ToyPacked(), head, _cpu(linear_kernels=(PlatformLinear,)))
    assert offered.kernel is TorchLinearKernel and offered.full_precision  # not preferred: the format's order
    preferred = select_kernel(ToyPacked(), head, _cpu(preference=("platform-linear",), linear_kernels=(PlatformLinear,)))
    assert preferred.kernel is PlatformLinear and isinstance(preferred.quantizer, Unquantized)
    assert preferred.name == "platform-linear (full precision)"


def test_platform_linear_kernels_stand_in_for_a_formats_plain_weight_kernel():
    spec = LinearSpec("model.layers.0.mlp.down_proj", 8, 8, (8,), False, "float32")
    target = _cpu(preference=("platform-linear",), linear_kernels=(PlatformLinear,))
    choice = select_kernel(Dequantizing(), spec, target)
    assert choice.kernel.name == "toy-dequantized+platform-linear" and choice.kernel.layout == "dequantize"
    assert issubclass(choice.kernel, PlatformLinear) and choice.kernel.plain_weight
    assert select_kernel(Dequantizing(), spec, target).kernel is choice.kernel  # one class per pair
    packed = Dequantizing()
    packed.packed = True
    pinned = select_kernel(packed, spec, target)
    assert pinned.kernel is UnpackKernel
    assert [r.render() for r in pinned.rejections] == ["toy-dequantized+platform-linear: pinned to packed",
                                                       "toy-dequantized: pinned to packed"]
    bf16 = select_kernel(Dequantizing(), LinearSpec("o", 8, 8, (8,), False, "bfloat16"), target)
    assert bf16.kernel is DequantizedKernel
    assert select_kernel(ToyPacked(), spec, target).kernel is UnpackKernel  # no plain-weight kernel to stand in for


def test_unquantized_layers_and_the_lm_head():
    build = ModelBuildContext(dtype="bfloat16", quantizer=ToyPacked())
    head = build.lm_head(32, 16)  # ToyPacked leaves lm_head unquantized
    assert isinstance(head.quantizer, Unquantized) and isinstance(head.kernel, TorchLinearKernel)
    assert head.weight.dtype == torch.bfloat16
    head.weight.data.normal_()
    assert head(torch.randn(3, 16, dtype=torch.bfloat16)).dtype == torch.float32
    embedding = VocabEmbedding(32, 16, dtype=torch.bfloat16)
    embedding.weight.data.normal_()
    tied = build.lm_head(32, 16, tied_to=embedding, prefix="tied_lm_head")
    assert tied.weight is embedding.weight and tied.tied
    hidden = torch.randn(2, 16, dtype=torch.bfloat16)
    torch.testing.assert_close(tied(hidden), (hidden @ embedding.weight.T).float())
    assert torch.equal(embedding(torch.tensor([3, 1])), embedding.weight[[3, 1]])
    assert build.kernel_summary() == {"torch-linear": 2}


def test_unquantized_quantizer_contract():
    assert Unquantized.detect({}, "/nowhere") == 0.01
    layer = Linear(LinearSpec("x", 3, 5, (5,), False, "float16"), Unquantized(), TorchLinearKernel())
    assert layer.weight.shape == (5, 3) and layer.weight.dtype == torch.float16 and layer.bias is None
    assert not layer.weight.requires_grad


def test_build_context_validates_attention_and_reads_the_platform():
    platform = ReferencePlatform()
    build = ModelBuildContext.for_platform(platform, dtype="float32", block_size=32,
                                           attention_backend=ReferenceAttentionBackend)
    assert (build.device, build.device_type, build.platform_name) == (torch.device("cpu"), "cpu", "reference")
    spec = build.attention_spec(8, 2, 64, sliding_window=128)
    assert (spec.dtype, spec.block_size, spec.scale, spec.sliding_window) == ("float32", 32, 0.125, 128)
    bad = ModelBuildContext(dtype=torch.float64, attention_backend=ReferenceAttentionBackend)
    with pytest.raises(AttentionSpecError, match="'reference' cannot run.*dtype float64 not supported"):
        bad.attention_spec(8, 2, 64)
