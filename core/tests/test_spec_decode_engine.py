"""Speculative decoding end to end on the CPU platform with tiny random Llamas: draft_model (the
target's own checkpoint, and another model that disagrees often) and ngram give exactly the tokens
plain decoding gives, next to requests that cannot speculate; bad configurations are refused clearly."""

import hf_parity as parity
import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.spec_decode.config import SpeculativeConfig
from tokenmill.spec_decode.ngram_proposer import NgramProposer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return parity.save_llama(tmp_path_factory.mktemp("spec-target"), seed=0)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return parity.save_llama(tmp_path_factory.mktemp("spec-other"), seed=1)


PROMPTS = [[5, 9, 17, 33, 2, 81], [100, 7], list(range(40, 75)), [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3], [150]]


def engine(model: str, speculative=None, **kwargs) -> LLM:
    settings = dict(device="cpu", dtype="float32", kv_cache_memory="8MiB", max_num_seqs=8, seed=0)
    settings.update(kwargs)
    return LLM(model, speculative_config=speculative, **settings)


def generate(llm: LLM, params) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def mixed_params() -> list[SamplingParams]:
    greedy = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (40, 17, 33, 40)]
    return [*greedy, SamplingParams(temperature=0.9, seed=11, max_tokens=25, ignore_eos=True)]


@pytest.fixture(scope="module")
def plain(target):
    return generate(engine(target), mixed_params())


def acceptance(llm: LLM):
    stats = llm.engine.core.scheduler.stats()
    return stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens


def test_the_targets_own_checkpoint_as_draft_accepts_every_token(target, plain):
    llm = engine(target, {"method": "draft_model", "num_speculative_tokens": 5})
    assert generate(llm, mixed_params()) == plain
    drafted, accepted = acceptance(llm)
    assert drafted > 50 and accepted == drafted
    proposer = llm.engine.core.runner.proposer
    assert proposer.graphs is not None and proposer.graphs.graphs  # the draft decodes through its own graphs


def test_a_disagreeing_draft_changes_no_token(target, other, plain):
    llm = engine(target, {"method": "draft_model", "model": other, "num_speculative_tokens": 3})
    assert generate(llm, mixed_params()) == plain
    drafted, accepted = acceptance(llm)
    assert drafted > 50 and accepted < drafted


def test_ngram_changes_no_token(target, plain):
    llm = engine(target, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1})
    assert generate(llm, mixed_params()) == plain
    assert acceptance(llm)[0] > 0


def test_eager_engine_and_preemption_change_no_token(target, other, plain):
    llm = engine(target, {"method": "draft_model", "model": other, "num_speculative_tokens": 4}, enforce_eager=True,
                 kv_cache_memory=9 * 16 * 512, max_num_seqs=5)  # 9 blocks of 16 tokens, 512 bytes each
    assert generate(llm, mixed_params()) == plain
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_draft_with_another_attention_layout_is_refused(target, tmp_path):
    wider = parity.save_llama(tmp_path / "wider", seed=2, num_key_value_heads=4)
    with pytest.raises(ValueError, match="another attention layout"):
        engine(target, {"method": "draft_model", "model": wider, "num_speculative_tokens": 2})


@pytest.mark.parametrize(("value", "message"), [
    ("{", "not valid JSON"),
    ('["ngram"]', "must be a JSON object"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "from 1 to 16"),
    ({"method": "ngram", "num_speculative_tokens": True}, "from 1 to 16"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft": "x"}, "unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "do not apply to method 'ngram'"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "do not apply"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "larger than"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "quantization_config": [1]}, "must be a JSON object"),
])
def test_bad_configurations_are_explained(value, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(value)


def test_configuration_parses_from_json_and_describes_itself():
    assert SpeculativeConfig.parse(None) is None and SpeculativeConfig.parse("") is None
    config = SpeculativeConfig.parse('{"method": "draft_model", "num_speculative_tokens": 4, '
                                     '"quantization_config": {"gguf_mode": "packed"}}')
    assert config.num_speculative_tokens == 4 and config.quantization_config == {"gguf_mode": "packed"}
    assert "gguf_mode" in config.describe() and "4 draft tokens" in config.describe()
    assert "ngram" in SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2}).describe()


def test_ngram_lookup_takes_the_latest_longest_match():
    proposer = NgramProposer(3, min_n=1, max_n=3)
    assert proposer.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]) == [7, 8, 1]
    assert proposer.lookup([5, 6, 7, 6]) == [7, 6]
    assert proposer.lookup([1, 2, 3, 4]) == []
    assert proposer.lookup([4, 4], max_tokens=1) == [4]
    assert NgramProposer(3, min_n=2, max_n=2).lookup([1, 2, 9, 3, 2]) == []
