"""A bfloat16 model on the CPU platform (the default dtype on CPUs with native bf16 dot products):
its layer kernels and decode attention in C, through a prefill and decodes of unequal requests, are
as close to the float32 model of the same weights as core's plain-PyTorch bfloat16 layers are."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill_cpu.attention import CpuAttentionBackend
from tokenmill_cpu.layer_kernels import layer_ops_unavailable
from tokenmill_cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the CPU kernels")
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1, rms_norm_eps=1e-5)


def _steps(prompts, decodes: int) -> list[list[tuple[int, list[int]]]]:
    """One prefill of all prompts, then ``decodes`` steps feeding each request fixed tokens (the same
    inputs for every run: bfloat16 rounding may flip a near tie)."""
    decode_steps = [[(i, [(31 * step + 7 * i) % 250 + 1]) for i in range(len(prompts))] for step in range(decodes)]
    return [list(enumerate(prompts)), *decode_steps]


def test_a_bfloat16_model_is_as_accurate_as_the_pytorch_layers(tmp_path, model_harness):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).eval().save_pretrained(tmp_path)
    steps = _steps([[(11 * i + 5 * j) % 250 + 1 for j in range(n)] for i, n in enumerate((3, 17, 40, 9))], decodes=6)
    model, native_build = model_harness.load(tmp_path, dtype=torch.bfloat16, platform=CpuPlatform(),
                                             attention_backend=CpuAttentionBackend)
    assert native_build.layer_kernels is not None
    reference, backend, calls = ReferenceAttentionBackend, CpuAttentionBackend(), []
    kernel = backend._decode_kernels[torch.bfloat16]
    backend._decode_kernels[torch.bfloat16] = lambda *args: calls.append(kernel(*args))
    native = model_harness.step_logits(model, steps, backend)
    assert len(calls) == 6 * CONFIG["num_hidden_layers"]  # every decode step, every layer, in C
    plain_model, _ = model_harness.load(tmp_path, dtype=torch.bfloat16, attention_backend=reference)
    plain = model_harness.step_logits(plain_model, steps, reference())
    exact_model, _ = model_harness.load(tmp_path, dtype=torch.float32, attention_backend=reference)
    exact = model_harness.step_logits(exact_model, steps, reference())
    for got, usual, want in zip(native, plain, exact, strict=True):
        error, usual_error = (got - want).abs(), (usual - want).abs()
        assert float(error.mean()) <= 1.25 * float(usual_error.mean()) + 1e-3
        assert float(error.max()) <= 1.5 * float(usual_error.max()) + 0.02
