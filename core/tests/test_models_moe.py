"""Mixtral, Qwen2-MoE and Qwen3-MoE against Hugging Face transformers (prefill and 16 decode
steps), and FusedMoE against a per-token reference: routing, renormalisation, shared experts,
dense layers among sparse ones, stacked-checkpoint loading."""

import hf_parity as parity
import pytest
import torch
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

from tokenmill.layers.moe import FusedMoE, route

COMMON = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, initializer_range=0.15, rms_norm_eps=1e-5, num_experts_per_tok=2)

CONFIGS = {
    "mixtral-sliding": lambda: MixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=6, sliding_window=7),
    "qwen2-moe-shared-expert-mixed-layers": lambda: Qwen2MoeConfig(
        **COMMON, num_hidden_layers=3, num_experts=8, moe_intermediate_size=40, shared_expert_intermediate_size=56,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1]),
    "qwen3-moe-renormalised": lambda: Qwen3MoeConfig(**COMMON, num_hidden_layers=2, num_experts=8,
                                                     moe_intermediate_size=40, norm_topk_prob=True, head_dim=32),
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
def test_decode_matches_hf_kv_cache(checkpoints, name):
    path, hf = checkpoints(name)
    parity.check_decode(path, hf)


def test_layer_layout_follows_the_config(checkpoints):
    qwen2 = parity.Runner(checkpoints("qwen2-moe-shared-expert-mixed-layers")[0]).model
    kinds = [type(layer.mlp).__name__ for layer in qwen2.model.layers]
    assert kinds == ["SparseMoeBlock", "GatedMLP", "SparseMoeBlock"]
    assert qwen2.model.layers[0].mlp.experts.w13_weight.shape == (8, 80, 64)
    assert not qwen2.model.layers[0].mlp.experts.renormalize
    mixtral = parity.Runner(checkpoints("mixtral-sliding")[0]).model
    assert [s.sliding_window for s in mixtral.attention_specs()] == [7, 7]
    assert mixtral.model.layers[0].block_sparse_moe.experts.w2_weight.shape == (6, 64, 96)


def _per_token_reference(moe: FusedMoE, x, logits):
    weights, ids = route(logits, moe.top_k, moe.renormalize)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(moe.top_k):
            e = int(ids[t, j])
            gate, up = (moe.w13_weight[e] @ x[t]).chunk(2)
            out[t] += weights[t, j] * (moe.w2_weight[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_fused_moe_matches_a_per_token_loop(renormalize, tokens):
    gen = torch.Generator().manual_seed(tokens)
    moe = FusedMoE(5, 2, 16, 12, renormalize=renormalize, float32_weights=True)
    moe.w13_weight.data.copy_(torch.randn(5, 24, 16, generator=gen) * 0.3)
    moe.w2_weight.data.copy_(torch.randn(5, 16, 12, generator=gen) * 0.3)
    x = torch.randn(tokens, 16, generator=gen)
    logits = torch.randn(tokens, 5, generator=gen)
    torch.testing.assert_close(moe(x, logits), _per_token_reference(moe, x, logits), atol=1e-5, rtol=1e-5)


def test_route_renormalises_only_when_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(weights, probs[:, :2])
    weights, _ = route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))


def test_expert_loading_per_expert_and_stacked_agree():
    gen = torch.Generator().manual_seed(0)
    per_expert, stacked = FusedMoE(3, 1, 4, 2), FusedMoE(3, 1, 4, 2)
    gates, ups, downs = (torch.randn(3, 2, 4, generator=gen), torch.randn(3, 2, 4, generator=gen),
                         torch.randn(3, 4, 2, generator=gen))
    for e in range(3):
        per_expert.load_expert(e, "gate", gates[e])
        assert per_expert.complete() == set()
        per_expert.load_expert(e, "up", ups[e])
        per_expert.load_expert(e, "down", downs[e])
    stacked.load_stacked("gate_up", torch.cat([gates, ups], dim=1))
    stacked.load_stacked("down", downs)
    assert per_expert.complete() == stacked.complete() == {"w13_weight", "w2_weight"}
    assert torch.equal(per_expert.w13_weight, stacked.w13_weight)
    assert torch.equal(per_expert.w2_weight, stacked.w2_weight)
    with pytest.raises(ValueError, match="expert 3 does not exist"):
        per_expert.load_expert(3, "gate", gates[0])


def test_missing_expert_is_reported(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    from tokenmill.loader.model_loader import MissingWeightsError, build_model, load_weights

    path, hf = checkpoints("qwen3-moe-renormalised")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    from tokenmill.layers.context import ModelBuildContext

    model = build_model(hf.config, ModelBuildContext())
    with pytest.raises(MissingWeightsError, match=r"model\.layers\.1\.mlp\.experts\.w13_weight"):
        load_weights(model, str(tmp_path))


def test_llm_greedy_generation_matches_hf(checkpoints):
    """Through the whole engine (its unquantized quantizer, scheduler and sampler)."""
    from tokenmill import LLM, SamplingParams

    path, hf = checkpoints("qwen2-moe-shared-expert-mixed-layers")
    parity.save_word_tokenizer(path, hf.config.vocab_size)
    llm = LLM(str(path), dtype="float32", kv_cache_memory="16MiB")
    prompts = parity.prompts(hf.config.vocab_size, [6, 19], seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert output.outputs[0].token_ids == want[0, len(prompt):].tolist()
