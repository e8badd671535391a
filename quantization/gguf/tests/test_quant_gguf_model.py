"""Tiny GGUF models (untied and tied heads, q/k/v of mixed ggml types, qwen2 biases) run through
tokenmill's model in both layouts, against transformers' forward on its own load of the same file."""

from __future__ import annotations

import os

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from tokenmill_quant_gguf.quantizer import GGUFQuantizer

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.1)
T = gguf.GGMLQuantizationType


def mixed_types(name: str) -> gguf.GGMLQuantizationType:
    """Q4_K_M-like: v and down in a wider type than q/k/gate/up, the head in Q8_0."""
    if ".attn_v." in name or ".ffn_down." in name:
        return T.Q8_0
    return T.Q5_1 if name.startswith("blk.") else T.Q8_0




@pytest.mark.parametrize("arch, config", [
    ("llama", lambda: LlamaConfig(**COMMON, tie_word_embeddings=False)),
    ("llama", lambda: LlamaConfig(**COMMON, tie_word_embeddings=True)),
    ("qwen2", lambda: Qwen2Config(**COMMON, tie_word_embeddings=False)),
], ids=["llama", "llama-tied", "qwen2"])
@pytest.mark.parametrize("mode", ["dequantize", "packed"])
def test_tokenmill_matches_transformers_on_the_same_gguf(gguf_fixtures, model_harness, arch, config, mode):
    torch.manual_seed(0)
    path = gguf_fixtures.from_hf_model(AutoModelForCausalLM.from_config(config()), arch, mixed_types)
    reference = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32).eval()
    quantizer = GGUFQuantizer(path, mode)
    model, build = model_harness.load(path, quantizer.hf_config(path), quantizer=quantizer)
    kernel = "gguf-dequantized" if mode == "dequantize" else "gguf-packed-torch"
    tied = quantizer.hf_config(path)["tie_word_embeddings"]
    if tied and mode == "dequantize":  # the head shares the embedding's float matrix
        assert build.kernel_summary() == {kernel: 8, "torch-linear": 1}
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:  # 4 per layer and the head (a tied one reads the embedding's Q8_0 blocks)
        assert build.kernel_summary() == {kernel: 9}
    if mode == "packed":
        assert [t.name for _, _, t in model.lm_head.gguf_segments] == ["Q8_0"]
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert [t.name for _, _, t in qkv.gguf_segments] == ["Q5_1", "Q8_0"]

    tokens = [5, 17, 42, 8, 91, 33, 2, 60]
    got = model_harness.prefill_logits(model, tokens)
    with torch.inference_mode():
        want = reference(input_ids=torch.tensor([tokens])).logits[0]
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
