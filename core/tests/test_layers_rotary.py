"""Rotary embedding against Hugging Face's frequencies and rotation, for every supported rope type."""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, PhiConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding
from transformers.models.phi.modeling_phi import apply_rotary_pos_emb as phi_apply_rotary_pos_emb

from tokenmill.layers.rotary import build_rotary, rope_parameters

HEAD = 32
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
}


def llama_config(rope, max_position=512):
    return LlamaConfig(hidden_size=HEAD * 4, num_attention_heads=4, max_position_embeddings=max_position,
                       rope_parameters=dict(rope))


def hf_cos_sin(hf_rope, positions):
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = hf_rope(x, positions[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("name", list(ROPES))
def test_tables_match_hf(name):
    config = llama_config(ROPES[name])
    ours = build_rotary(config, HEAD)
    positions = torch.tensor([0, 1, 2, 17, 100, 511])
    cos, sin = hf_cos_sin(LlamaRotaryEmbedding(config), positions)
    torch.testing.assert_close(ours.cos[positions], cos[:, : HEAD // 2], atol=0, rtol=0)
    torch.testing.assert_close(ours.sin[positions], sin[:, : HEAD // 2], atol=0, rtol=0)
    expected_max = 512 * 4 if name == "linear" else 512
    assert ours.max_position == expected_max


def test_dynamic_ntk_matches_hf_decoding_one_token_at_a_time():
    config = llama_config({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, max_position=64)
    ours = build_rotary(config, HEAD)
    assert ours.max_position == 128
    hf_rope = LlamaRotaryEmbedding(config)
    for p in [0, 5, 63, 64, 65, 90, 127]:
        cos, sin = hf_cos_sin(hf_rope, torch.tensor([p]))
        torch.testing.assert_close(ours.cos[p], cos[0, : HEAD // 2], atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.sin[p], sin[0, : HEAD // 2], atol=1e-6, rtol=0)
    # positions past the original length really use a larger base
    default = build_rotary(llama_config(ROPES["default"], max_position=128), HEAD)
    assert not torch.allclose(ours.cos[100], default.cos[100])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_matches_hf(dtype):
    config = llama_config(ROPES["llama3"])
    ours = build_rotary(config, HEAD)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, HEAD, generator=gen).to(dtype)
    k = torch.randn(6, 2, HEAD, generator=gen).to(dtype)
    positions = torch.tensor([3, 4, 5, 0, 1, 300])
    got_q, got_k = ours(positions, q, k)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), atol=0, rtol=0)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), atol=0, rtol=0)


def test_partial_rotary_matches_phi():
    config = PhiConfig(hidden_size=HEAD * 4, num_attention_heads=4, partial_rotary_factor=0.5,
                       max_position_embeddings=256)
    ours = build_rotary(config, HEAD)
    assert ours.rotary_dim == HEAD // 2
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(5, 4, HEAD, generator=gen)
    k = torch.randn(5, 4, HEAD, generator=gen)
    positions = torch.tensor([0, 1, 2, 3, 200])
    got_q, got_k = ours(positions, q, k)
    cos, sin = PhiRotaryEmbedding(config)(q, positions[None])
    rot = HEAD // 2
    want_q, want_k = phi_apply_rotary_pos_emb(q[..., :rot].transpose(0, 1)[None], k[..., :rot].transpose(0, 1)[None],
                                              cos, sin)
    torch.testing.assert_close(got_q[..., :rot], want_q[0].transpose(0, 1), atol=0, rtol=0)
    torch.testing.assert_close(got_k[..., :rot], want_k[0].transpose(0, 1), atol=0, rtol=0)
    assert torch.equal(got_q[..., rot:], q[..., rot:])


def test_legacy_rope_scaling_fields_are_read():
    legacy = SimpleNamespace(rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 2.0},
                             max_position_embeddings=32)
    assert rope_parameters(legacy) == {"rope_theta": 1234.0, "rope_type": "linear", "factor": 2.0}
    plain = SimpleNamespace(rope_theta=99.0, rope_scaling=None, max_position_embeddings=32)
    assert rope_parameters(plain) == {"rope_theta": 99.0, "rope_type": "default"}
    assert build_rotary(legacy, 8).max_position == 64


def test_unsupported_rope_type_is_named():
    config = SimpleNamespace(rope_parameters={"rope_type": "longrope", "rope_theta": 1.0}, max_position_embeddings=8)
    with pytest.raises(ValueError, match="longrope.*supported: default, linear, dynamic, llama3"):
        build_rotary(config, 8)
