"""The real SmolLM2-135M-Instruct Q4_1 GGUF: detection, config, tokenizer, every tensor against
transformers' own GGUF load, and tokenmill's model built from it (both layouts) against HF logits."""

from __future__ import annotations

import os

import pytest
import torch

from tokenmill.plugin_api.linear import Linear
from tokenmill_quant_gguf.quantizer import GGUFQuantizer


def test_detect_file_and_directory(smollm2_gguf, tmp_path):
    assert GGUFQuantizer.detect({}, smollm2_gguf) == 1.0
    assert GGUFQuantizer.detect({}, os.path.dirname(smollm2_gguf)) == 1.0
    assert GGUFQuantizer.detect({}, str(tmp_path)) == 0.0
    (tmp_path / "fake.gguf").write_bytes(b"GGML" + bytes(60))
    assert GGUFQuantizer.detect({}, str(tmp_path / "fake.gguf")) == 0.0
    assert GGUFQuantizer.detect({}, str(tmp_path / "missing.gguf")) == 0.0


def test_hf_config(smollm2_gguf):
    config = GGUFQuantizer.from_config({}, smollm2_gguf).hf_config(smollm2_gguf)
    assert config["bos_token_id"] == 1 and config["eos_token_id"] == 2
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (30, 576, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (9, 3, 64)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 100000.0


def test_tokenizer_with_chat_template(smollm2_gguf):
    tokenizer = GGUFQuantizer.from_config({}, smollm2_gguf).tokenizer(smollm2_gguf)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(tokenizer("Hello world").input_ids) == "Hello world"


def test_describe(smollm2_gguf):
    text = GGUFQuantizer.from_config({}, smollm2_gguf).describe()
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in text and "210 Q4_1" in text and "1 Q8_0" in text


@pytest.mark.slow
def test_hf_config_equals_transformers_derivation(smollm2_gguf):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    expected = load_gguf_checkpoint(smollm2_gguf, return_tensors=False)["config"]
    expected.pop("_model_name_or_path")
    ours = GGUFQuantizer.from_config({}, smollm2_gguf).hf_config(smollm2_gguf)
    assert ours.pop("architectures") == ["LlamaForCausalLM"]
    assert ours == expected


@pytest.fixture(scope="module")
def hf_reference(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    directory, name = os.path.split(smollm2_gguf)
    return AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()


@pytest.mark.slow
def test_every_tensor_equals_transformers_gguf_load(smollm2_gguf, hf_reference):
    expected = hf_reference.state_dict()
    expected.pop("lm_head.weight")  # tied to the embedding; the file has no output.weight
    loaded = dict(GGUFQuantizer.from_config({}, smollm2_gguf).weights(smollm2_gguf))
    assert set(loaded) == set(expected)
    assert {int(n.split(".")[2]) for n in loaded if n.startswith("model.layers.")} == set(range(30))
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name




@pytest.fixture(scope="module")
def tokenmill_models(smollm2_gguf, model_harness):
    """mode -> (tokenmill model loaded from the file, its build context), built once per mode."""
    made = {}

    def get(mode):
        if mode not in made:
            quantizer = GGUFQuantizer(smollm2_gguf, mode)
            made[mode] = model_harness.load(smollm2_gguf, quantizer.hf_config(smollm2_gguf), quantizer=quantizer)
        return made[mode]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("mode, kernel", [("dequantize", "gguf-dequantized"), ("packed", "gguf-packed-torch")])
def test_tokenmill_model_matches_hf_logits(tokenmill_models, model_harness, hf_reference, mode, kernel):
    model, build = tokenmill_models(mode)
    # 4 per layer; the tied head shares the float embedding, or in the packed layout reads its Q8_0 blocks
    expected = {kernel: 120, "torch-linear": 1} if mode == "dequantize" else {kernel: 121}
    assert build.kernel_summary() == expected
    tokens = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 2, 198, 1, 4093, 198]
    with torch.inference_mode():
        want = hf_reference(input_ids=torch.tensor([tokens])).logits[0]
    got = model_harness.prefill_logits(model, tokens)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.slow
def test_packed_linear_weights_take_a_fraction_of_fp32(tokenmill_models):
    model, _ = tokenmill_models("packed")
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.quantizer.name == "gguf"]
    stored = sum(p.numel() * p.element_size() for m in linears for p in m.parameters())
    fp32 = sum(m.spec.in_features * m.spec.out_features * 4 for m in linears)
    assert stored <= 0.35 * fp32
    assert all(m.qweight.dtype == torch.uint8 and not hasattr(m, "weight") for m in linears)
