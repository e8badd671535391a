"""Phi-3 against Hugging Face transformers: fused qkv_proj / gate_up_proj checkpoints, partial
rotary, a sliding window shorter than the sequences, and LongRoPE within the original context."""

import hf_parity as parity
import pytest
import torch
from transformers import Phi3Config

COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              initializer_range=0.15, rms_norm_eps=1e-5, num_hidden_layers=2, pad_token_id=0)


def _longrope():
    rotary_half = 16 * 3 // 4 // 2  # head 16, partial 0.75
    return Phi3Config(**COMMON, max_position_embeddings=512, original_max_position_embeddings=128,
                      partial_rotary_factor=0.75,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                       "short_factor": [1.0 + 0.1 * i for i in range(rotary_half)],
                                       "long_factor": [2.0 + 0.5 * i for i in range(rotary_half)],
                                       "original_max_position_embeddings": 128})


CONFIGS = {
    "phi3-sliding": lambda: Phi3Config(**COMMON, max_position_embeddings=256, sliding_window=7),
    "phi3-longrope-partial": _longrope,
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


def test_checkpoint_ships_fused_projections(checkpoints):
    from safetensors import safe_open

    path, _ = checkpoints("phi3-sliding")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_batch_matches_hf(checkpoints, name):
    path, hf = checkpoints(name)
    parity.check_prefill(path, hf)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decode_matches_hf_kv_cache(checkpoints, name):
    path, hf = checkpoints(name)
    parity.check_decode(path, hf)


def test_longrope_table_switches_factors_at_the_original_length(checkpoints):
    from tokenmill.layers.longrope import longrope_attention_factor

    path, hf = checkpoints("phi3-longrope-partial")
    model = parity.Runner(path).model
    rotary = model.model.rotary
    assert rotary.rotary_dim == 12 and rotary.max_position == 512
    scale = longrope_attention_factor({}, 512, 128)
    assert scale == pytest.approx((1 + torch.log(torch.tensor(4.0)) / torch.log(torch.tensor(128.0))).sqrt().item())
    params = hf.config.rope_parameters
    exponents = torch.arange(0, 12, 2).float() / 12
    for position, factors in ((127, params["short_factor"]), (128, params["long_factor"]), (400, params["long_factor"])):
        inv_freq = 1.0 / (torch.tensor(factors) * 10000.0**exponents)
        torch.testing.assert_close(rotary.cos[position], (position * inv_freq).cos() * scale)


def test_unsupported_rope_type_is_a_clear_error(tmp_path):
    from tokenmill.layers.context import ModelBuildContext
    from tokenmill.loader.model_loader import build_model

    config = Phi3Config(**COMMON, max_position_embeddings=256)
    config.rope_parameters = {"rope_type": "yarn-like-unknown", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope type 'yarn-like-unknown' is not supported"):
        build_model(config, ModelBuildContext())
