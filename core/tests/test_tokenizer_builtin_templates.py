"""Built-in chat templates: rendering of the Gemma, ChatML and Phi-3 families, lookup by
architecture, and InputProcessor's choice (explicit > engine > model's own > built-in, logged)."""

import logging
from types import SimpleNamespace

import pytest
from jinja2.exceptions import TemplateError
from transformers.utils.chat_template_utils import render_jinja_template

from tokenmill.config import ModelConfig
from tokenmill.frontend.input_processor import InputProcessor
from tokenmill.tokenizer.builtin_templates import CHATML, GEMMA, PHI3, builtin_chat_template

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi! "},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": [{"type": "text",
                                                                                          "text": "Bye"}]}]


def render(template, messages, **extra):
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, add_generation_prompt=True,
                                        bos_token="<bos>", **extra)
    return rendered[0]


def test_gemma_folds_the_system_prompt_into_the_first_user_turn():
    assert render(GEMMA, CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(TemplateError, match="must alternate"):
        render(GEMMA, [{"role": "assistant", "content": "x"}])


def test_chatml_and_phi3_turns():
    assert render(CHATML, CONVERSATION[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    assert render(PHI3, CONVERSATION[1:3]) == "<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n<|assistant|>\n"


def test_lookup_by_architecture():
    assert builtin_chat_template("Gemma3ForCausalLM").family == "gemma"
    assert builtin_chat_template("Qwen3MoeForCausalLM").family == "chatml"
    assert builtin_chat_template("Phi3ForCausalLM").family == "phi3"
    assert builtin_chat_template("LlamaForCausalLM") is None
    assert builtin_chat_template(None) is None


def _model(architecture, chat_template=None):
    return ModelConfig(path="m", tokenizer_path="m", architecture=architecture, hf_config=None, dtype="float32",
                       max_model_len=64, vocab_size=100, eos_token_ids=(1,), generation_defaults={},
                       served_model_name="tiny", quantization="unquantized", chat_template=chat_template)


def test_input_processor_picks_the_builtin_only_when_nothing_else_exists(caplog):
    bare = SimpleNamespace(chat_template=None, eos_token_id=1)
    with caplog.at_level(logging.INFO, logger="tokenmill"):
        assert InputProcessor(bare, _model("Gemma2ForCausalLM"), 5).chat_template == GEMMA
    assert "tiny has no chat template: using tokenmill's built-in gemma template" in caplog.text
    assert InputProcessor(bare, _model("Gemma2ForCausalLM", "{{ 'mine' }}"), 5).chat_template == "{{ 'mine' }}"
    own = SimpleNamespace(chat_template="{{ 'own' }}", eos_token_id=1)
    assert InputProcessor(own, _model("Gemma2ForCausalLM"), 5).chat_template is None  # the tokenizer's own wins
    assert InputProcessor(bare, _model("LlamaForCausalLM"), 5).chat_template is None
