"""A bfloat16 model on the CPU platform (the default dtype on CPUs with native bf16 dot products):
its layer kernels and decode attention in C, through a prefill and decodes of unequal requests, are
as close to the float32 model of the same weights as core's plain-PyTorch bfloat16 layers are."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model, load_weights
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.paged_harness import PagedHarness
from tokenmill_cpu.attention import CpuAttentionBackend
from tokenmill_cpu.layer_kernels import layer_ops_unavailable
from tokenmill_cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(layer_ops_unavailable() is not None, reason="no C compiler for the CPU kernels")
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1, rms_norm_eps=1e-5)


def _logits_per_step(directory, build: ModelBuildContext, backend, prompts, decodes: int) -> list[torch.Tensor]:
    """The logits of every step: one prefill of all prompts, then ``decodes`` steps feeding each
    request fixed tokens (the same inputs for both runs: bfloat16 rounding may flip a near tie)."""
    model = build_model(LlamaConfig(**CONFIG), build)
    load_weights(model, str(directory))
    harness = PagedHarness(block_size=16, num_blocks=32)
    caches = harness.allocate_caches(backend, model.attention_specs())
    steps, chunks = [], [(i, prompt) for i, prompt in enumerate(prompts)]
    with torch.inference_mode():
        for step_index in range(decodes + 1):
            step = harness.step(chunks)
            hidden = model(step.input_ids, step.positions, harness.context(backend, caches, step))
            last = torch.tensor([len(tokens) for _, tokens in chunks]).cumsum(0) - 1
            steps.append(model.compute_logits(hidden[last]).float())
            chunks = [(i, [(31 * step_index + 7 * i) % 250 + 1]) for i in range(len(prompts))]
    return steps


def test_a_bfloat16_model_is_as_accurate_as_the_pytorch_layers(tmp_path):
    platform = CpuPlatform()
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIG)).eval().save_pretrained(tmp_path)
    prompts = [[(11 * i + 5 * j) % 250 + 1 for j in range(n)] for i, n in enumerate((3, 17, 40, 9))]
    native_build = ModelBuildContext.for_platform(platform, dtype=torch.bfloat16,
                                                  attention_backend=CpuAttentionBackend)
    assert native_build.layer_kernels is not None
    reference, backend, calls = ReferenceAttentionBackend, CpuAttentionBackend(), []
    kernel = backend._decode_kernels[torch.bfloat16]
    backend._decode_kernels[torch.bfloat16] = lambda *args: calls.append(kernel(*args))
    native = _logits_per_step(tmp_path, native_build, backend, prompts, decodes=6)
    assert len(calls) == 6 * CONFIG["num_hidden_layers"]  # every decode step, every layer, in C
    plain = _logits_per_step(tmp_path, ModelBuildContext(dtype=torch.bfloat16, attention_backend=reference),
                             reference(), prompts, decodes=6)
    exact = _logits_per_step(tmp_path, ModelBuildContext(dtype=torch.float32, attention_backend=reference),
                             reference(), prompts, decodes=6)
    for got, usual, want in zip(native, plain, exact, strict=True):
        error, usual_error = (got - want).abs(), (usual - want).abs()
        assert float(error.mean()) <= 1.25 * float(usual_error.mean()) + 1e-3
        assert float(error.max()) <= 1.5 * float(usual_error.max()) + 0.02
