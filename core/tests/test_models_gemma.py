"""Gemma 2 and Gemma 3 text against Hugging Face transformers: prefill and 16 decode steps on
tiny random-weight models whose sliding-window layers are shorter than the sequences, with
attention and final logits soft-capping, Gemma 3's q/k norms and per-layer-type rope bases."""

import hf_parity as parity
import pytest
import torch
from transformers import Gemma2Config, Gemma3TextConfig

COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-6,
              query_pre_attn_scalar=24, sliding_window=6)

CONFIGS = {
    "gemma2-softcaps": lambda: Gemma2Config(**COMMON, num_hidden_layers=3, attn_logit_softcapping=5.0,
                                            final_logit_softcapping=3.0),
    "gemma2-untied-no-caps": lambda: Gemma2Config(**COMMON, num_hidden_layers=2, attn_logit_softcapping=None,
                                                  final_logit_softcapping=None, tie_word_embeddings=False),
    "gemma3-pattern": lambda: Gemma3TextConfig(**COMMON, num_hidden_layers=4, sliding_window_pattern=2,
                                               rope_parameters={"sliding_attention": {"rope_type": "default",
                                                                                      "rope_theta": 100.0},
                                                                "full_attention": {"rope_type": "linear",
                                                                                   "factor": 4.0,
                                                                                   "rope_theta": 10000.0}}),
    "gemma3-layer-types-softcap": lambda: Gemma3TextConfig(
        **COMMON, num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=4.0, attn_logit_softcapping=6.0),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            made[name] = (path, parity.save_tiny(CONFIGS[name](), path))
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_batch_matches_hf(checkpoints, name):
    path, hf = checkpoints(name)
    parity.check_prefill(path, hf)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decode_beyond_the_window_matches_hf_kv_cache(checkpoints, name):
    path, hf = checkpoints(name)
    parity.check_decode(path, hf, lengths=(9, 17, 4))


def test_layer_specs_alternate_windows_and_carry_gemma_scaling(checkpoints):
    gemma2 = parity.Runner(checkpoints("gemma2-softcaps")[0]).model
    specs = gemma2.attention_specs()
    assert [s.sliding_window for s in specs] == [6, None, 6]
    assert {s.logits_soft_cap for s in specs} == {5.0}
    assert specs[0].scale == pytest.approx(24**-0.5)
    assert gemma2.lm_head.weight is gemma2.model.embed_tokens.weight
    gemma3 = parity.Runner(checkpoints("gemma3-pattern")[0]).model
    assert [s.sliding_window for s in gemma3.attention_specs()] == [6, None, 6, None]
    assert set(gemma3.model.rotary) == {"sliding_attention", "full_attention"}
    # linear scaling: the table covers max_position_embeddings, not factor times it
    assert gemma3.model.rotary["full_attention"].max_position == 256
    # Hugging Face's Gemma 3 ignores attn_logit_softcapping; the final logits stay capped
    capped = parity.Runner(checkpoints("gemma3-layer-types-softcap")[0]).model
    assert {s.logits_soft_cap for s in capped.attention_specs()} == {None}
    assert capped.final_logit_softcapping == 4.0


def test_gemma_norm_offsets_weight_from_one():
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from tokenmill.layers.gemma_norm import GemmaRMSNorm

    for dtype in (torch.float32, torch.bfloat16):
        ours, hf = GemmaRMSNorm(32, 1e-6, dtype=dtype), Gemma2RMSNorm(32, 1e-6).to(dtype)
        weight = torch.randn(32).to(dtype)
        ours.weight.data.copy_(weight)
        hf.weight.data.copy_(weight)
        x = (torch.randn(3, 32) * 4).to(dtype)
        assert torch.equal(ours(x), hf(x))
