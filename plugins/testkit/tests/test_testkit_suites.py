"""The testkit tested with pytester: each suite passes a correct implementation and catches a
deliberately broken one."""

from __future__ import annotations

import os
import sys

import pytest

# Each suite runs in its own pytest process: an in-process run restores sys.modules afterwards, and
# torch modules first imported inside it cannot be imported a second time by the tests that follow.
pytestmark = pytest.mark.live
pytest_plugins = ["pytester"]
ARGS = ("-p", "no:cacheprovider", "--import-mode=importlib", "-q", "-rfs")

PLATFORMS = '''
import os, sys, types
from tokenmill.plugin_api import Platform, PlatformCapabilities, ProbeResult
from tokenmill_testkit import PlatformConformance

class HostPlatform(Platform):
    name = "host"
    device_type = "cpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(10, ("always here",))

    @property
    def capabilities(self):
        return PlatformCapabilities()

class LeakyPlatform(HostPlatform):
    name = "leaky"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        os.environ["TESTKIT_LEAKY_PROBE"] = "1"
        sys.modules.setdefault("pynvml", types.ModuleType("pynvml"))
        return ProbeResult(10, ("always here",))

class BadDtypePlatform(HostPlatform):
    name = "baddtype"
    api_version = (2, 0)

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("fp32",))

class TestHost(PlatformConformance):
    platform_cls = HostPlatform

class TestLeaky(PlatformConformance):
    platform_cls = LeakyPlatform

class TestBadDtype(PlatformConformance):
    platform_cls = BadDtypePlatform
'''

ATTENTION = '''
import torch
from tokenmill.plugin_api import AttentionBackend, AttentionCapabilities
from tokenmill_testkit import AttentionBackendConformance, AttentionCase

class DenseBackend(AttentionBackend):
    """Default cache layout [2, blocks, block_size, kv_heads, head_size]; one request at a time."""
    name = "dense"
    api_version = (2, 0)
    capabilities = AttentionCapabilities(device_types=("cpu",), dtypes=("float32",))
    forget_context = False

    def forward(self, spec, query, key, value, kv_cache, batch):
        flat = kv_cache.view(2, -1, spec.num_kv_heads, spec.head_size)
        flat[0, batch.slot_mapping] = key
        flat[1, batch.slot_mapping] = value
        out, start = torch.empty_like(query), 0
        for i, (q_len, s_len) in enumerate(zip(batch.query_lens_cpu, batch.seq_lens_cpu)):
            ctx = s_len - q_len
            blocks = batch.block_tables[i].long()
            slots = (blocks[:, None] * batch.block_size + torch.arange(batch.block_size)).flatten()[:s_len]
            if self.forget_context:
                slots, ctx = slots[ctx:], 0
            k = flat[0, slots].repeat_interleave(spec.num_heads // spec.num_kv_heads, 1)
            v = flat[1, slots].repeat_interleave(spec.num_heads // spec.num_kv_heads, 1)
            scores = torch.einsum("qhd,khd->hqk", query[start:start + q_len], k) * spec.scale
            if spec.logits_soft_cap:
                scores = spec.logits_soft_cap * torch.tanh(scores / spec.logits_soft_cap)
            qpos = torch.arange(q_len)[:, None] + ctx
            kpos = torch.arange(k.shape[0])[None]
            mask = kpos <= qpos
            if spec.sliding_window:
                mask &= kpos > qpos - spec.sliding_window
            probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            out[start:start + q_len] = torch.einsum("hqk,khd->qhd", probs, v)
            start += q_len
        return out

class ForgetfulBackend(DenseBackend):
    """Attends only to the tokens of the current step: wrong as soon as a request has context."""
    name = "forgetful"
    api_version = (2, 0)
    forget_context = True

class Small:
    dtypes = ("float32",)

    def attention_cases(self):
        return (AttentionCase(4, 2, 32), AttentionCase(4, 2, 32, sliding_window=8, logits_soft_cap=2.0))

class TestDense(Small, AttentionBackendConformance):
    backend_cls = DenseBackend

class TestForgetful(Small, AttentionBackendConformance):
    backend_cls = ForgetfulBackend
'''

QUANTIZER = '''
import torch
from tokenmill.plugin_api import QuantKernel, Quantizer
from tokenmill_testkit import QuantizerConformance

class ReferenceKernel(QuantKernel):
    name = "int8-reference"

    def apply(self, layer, x, bias):
        w = layer.weight.float() * layer.scale.float()[:, None]
        return torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)

class NoBiasKernel(QuantKernel):
    name = "int8-forgets-bias"

    def apply(self, layer, x, bias):
        return torch.nn.functional.linear(x, layer.weight.to(x.dtype)) * layer.scale.to(x.dtype)

class Int8(Quantizer):
    name = "tinyint8"
    api_version = (2, 0)

    @classmethod
    def detect(cls, hf_config, model_path):
        return 1.0 if (hf_config.get("quantization_config") or {}).get("quant_method") == "tinyint8" else 0.0

    def kernels(self):
        return (NoBiasKernel, ReferenceKernel)

    def create_weights(self, layer, spec):
        weight = torch.nn.Parameter(torch.empty(spec.out_features, spec.in_features, dtype=torch.int8),
                                    requires_grad=False)
        scale = torch.nn.Parameter(torch.empty(spec.out_features), requires_grad=False)
        weight.output_dim = scale.output_dim = 0
        layer.register_parameter("weight", weight)
        layer.register_parameter("scale", scale)

class TestInt8(QuantizerConformance):
    quantizer_cls = Int8
    hf_config = {"quantization_config": {"quant_method": "tinyint8"}}
    dtypes = ("float32",)
'''


def _failed_tests(result) -> set[str]:
    return {line.split(" ")[1].split("::", 1)[1] for line in result.outlines if line.startswith("FAILED ")}


def test_platform_suite(pytester):
    pytester.makepyfile(test_platforms=PLATFORMS)
    try:
        result = pytester.runpytest_subprocess(*ARGS)
    finally:
        os.environ.pop("TESTKIT_LEAKY_PROBE", None)
        sys.modules.pop("pynvml", None)
    failed = _failed_tests(result)
    assert failed == {"TestLeaky::test_probe_has_no_side_effects", "TestBadDtype::test_capabilities_well_formed"}
    result.stdout.fnmatch_lines(["*os.environ changed: TESTKIT_LEAKY_PROBE*pynvml*", "*'fp32' is not a torch dtype*"])
    assert result.parseoutcomes()["passed"] >= 25


def test_attention_suite(pytester):
    pytester.makepyfile(test_attention=ATTENTION)
    result = pytester.runpytest_subprocess(*ARGS)
    failed = _failed_tests(result)
    assert failed and all(name.startswith("TestForgetful::test_") for name in failed), failed
    # Prefill-only batches have no context, so only mixes with cached tokens expose the bug.
    assert not any("prefill]" in name for name in failed)
    assert {"decode", "mixed", "prefix_hit"} <= {name.rsplit("-", 1)[1].rstrip("]") for name in failed
                                                 if "forward_matches_reference" in name}
    result.stdout.fnmatch_lines(["*attention output, layer 0, step 1 of mix*"])
    assert "TestDense::test_forward_matches_reference[h4kv2d32b16-float32-decode]" not in failed


def test_quantizer_suite(pytester):
    pytester.makepyfile(test_quantizer=QUANTIZER)
    result = pytester.runpytest_subprocess(*ARGS)
    assert _failed_tests(result) == {"TestInt8::test_kernel_matches_reference[int8-forgets-bias-float32-qkv_proj]"}
    result.stdout.fnmatch_lines(["*int8-forgets-bias on input (5, 256): max |error|*exceeds*"])
    assert result.parseoutcomes()["passed"] >= 8


GATED_KERNEL = QUANTIZER + '''
from tokenmill.plugin_api import PlatformCapabilities

class GatedKernel(ReferenceKernel):
    """Runs only on platforms tagged with the "tiny" family: what a vendor's real kernel looks like."""
    name = "int8-gated"

    @classmethod
    def supports(cls, quantizer, spec, device_type, caps):
        return None if "tiny" in caps.families else "needs the 'tiny' family"

class GatedInt8(Int8):
    name = "gatedint8"
    api_version = (2, 0)

    def kernels(self):
        return (GatedKernel, ReferenceKernel)

class TestGatedSkipped(QuantizerConformance):
    """The gate closes without capabilities: the kernel would be skipped, so naming it as required fails."""
    quantizer_cls = GatedInt8
    dtypes = ("float32",)
    required_kernels = ("int8-gated",)

class TestGatedRuns(TestGatedSkipped):
    capabilities = PlatformCapabilities(families=("tiny",))

class TestRequiredUnknown(TestGatedRuns):
    required_kernels = ("int8-gated", "int8-missing")
'''


def test_quantizer_suite_fails_a_required_kernel_that_is_skipped(pytester):
    pytester.makepyfile(test_gated=GATED_KERNEL)
    result = pytester.runpytest(*ARGS, "-k", "Gated or Required")
    failed = _failed_tests(result)
    assert {name for name in failed if name.startswith("TestGatedSkipped::")} == {
        "TestGatedSkipped::test_required_kernels_run",
        "TestGatedSkipped::test_kernel_matches_reference[int8-gated-float32-down_proj]",
        "TestGatedSkipped::test_kernel_matches_reference[int8-gated-float32-qkv_proj]",
    }
    assert not any(name.startswith("TestGatedRuns::") for name in failed), failed
    assert "TestRequiredUnknown::test_required_kernels_run" in failed
    result.stdout.fnmatch_lines(["*a required kernel would be skipped: int8-gated declines*needs the 'tiny' family*",
                                 "*required_kernels names ['int8-missing']*"])
    assert not [line for line in result.outlines if line.startswith("SKIPPED") and "int8-gated" in line]
    assert result.parseoutcomes()["passed"] >= 2 * 4 + 3  # TestGatedRuns ran the gated kernel on both shapes


def test_report_header_lists_installed_plugins(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["tokenmill plugin API *; plugins: *platforms:reference (tokenmill 0.1.0)*"])
