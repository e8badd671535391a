"""Structured outputs through the engine on a tiny random Llama with a word tokenizer ("<0>" ... "<159>",
so that no token is a prefix of another): every output follows its constraint and ends with the model's
EOS once the constraint is complete; a constrained request leaves the other requests of its batch
untouched; drafts skip constrained requests; a grammar the vocabulary cannot continue aborts its request."""

import re

import pytest
from hf_parity import save_bracketed_llama as save_model

from tokenmill import LLM, SamplingParams

EOS = 2  # LlamaConfig's default eos_token_id: "<2>"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(save_model(tmp_path_factory.mktemp("structured") / "tiny"), kv_cache_memory="16MiB")


def words(token_ids):
    return "".join(f"<{t}>" for t in token_ids)


def generate(llm, prompt, **params):
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 24, **params})
    return llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]


@pytest.mark.parametrize("choices", [["<7><8>", "<9>"], ["<11><12><13>", "<14><15>", "<16>"]])
def test_choice_output_is_one_of_the_choices_then_eos(llm, choices):
    out = generate(llm, [5, 6, 7], structured_outputs={"choice": choices})
    assert out.token_ids[-1] == EOS and out.finish_reason == "stop"
    assert words(out.token_ids[:-1]) in choices


def test_regex_and_grammar_outputs_match(llm):
    out = generate(llm, [9, 10], structured_outputs={"regex": "(<3>|<4>)+<5>"})
    text = words(out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids)
    assert re.fullmatch("(<3>|<4>)+<5>", text) if out.finish_reason == "stop" else re.fullmatch("(<3>|<4>)+", text)
    out = generate(llm, [9, 10], structured_outputs={"grammar": 'root ::= "<20>" ("<21>" | "<22>") "<23>"'})
    assert words(out.token_ids) in ("<20><21><23><2>", "<20><22><23><2>")


def test_random_sampling_follows_the_constraint(llm):
    choices = ["<30>", "<31><32>", "<33><34><35>"]
    params = SamplingParams(temperature=1.5, seed=7, n=6, max_tokens=8, structured_outputs={"choice": choices})
    outputs = llm.generate([{"prompt_token_ids": [3, 4]}], params, use_tqdm=False)[0].outputs
    assert len(outputs) == 6 and all(words(o.token_ids[:-1]) in choices for o in outputs)


def test_constrained_request_leaves_its_batch_alone(llm):
    prompts = [[11, 12, 13], [14, 15], [16, 17, 18, 19]]
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], plain,
                                                           use_tqdm=False)]
    constrained = plain.clone(structured_outputs={"choice": ["<40><41>"]})
    mixed = llm.generate([{"prompt_token_ids": p} for p in prompts], [plain, constrained, plain], use_tqdm=False)
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == [alone[0], alone[2]]
    # ignore_eos: the grammar still ends the request once it is complete and its EOS was taken
    assert mixed[1].outputs[0].token_ids == [40, 41, EOS] and mixed[1].outputs[0].finish_reason == "stop"


def test_malformed_constraint_is_refused_before_it_reaches_the_engine(llm):
    with pytest.raises(ValueError, match="invalid regex"):
        generate(llm, [1, 2], structured_outputs={"regex": "<1>("})


def test_speculative_drafts_skip_constrained_requests(tmp_path):
    llm = LLM(save_model(tmp_path / "tiny"), kv_cache_memory="16MiB",
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})
    prompt = [21, 22, 21, 22, 21, 22]
    out = generate(llm, prompt, structured_outputs={"regex": "<21><22><23>"})
    assert out.token_ids == [21, 22, 23, EOS]


def test_a_grammar_the_vocabulary_cannot_continue_aborts_its_request(llm):
    out = generate(llm, [3, 4], structured_outputs={"regex": "<1"})  # no token is "<1"
    assert out.finish_reason == "abort" and out.token_ids == []
