"""Request fields shared by the OpenAI completions and chat APIs: standard sampling fields plus
vLLM's extra sampling parameters. Bounds live in the schema (so /openapi.json tells fuzzers and
clients the truth); caps that depend on the server's flags are checked in ``sampling``."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


def _names_a_number(annotation: Any) -> bool:
    """Whether a field's type is or holds ``int`` or ``float`` (``bool`` is neither here)."""
    if annotation in (int, float):
        return True
    return any(_names_a_number(argument) for argument in get_args(annotation))


def _holds_a_boolean(value: Any) -> bool:
    """Whether ``value`` is, or its lists and mapping values hold, a JSON ``true`` or ``false``."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, bool):
            return True
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return False


class ApiModel(BaseModel):
    """Unknown fields are accepted (OpenAI compatibility) and reported by ``ignored_fields``. Numbers are
    read leniently as in vLLM (``"10"`` is 10), but a boolean is never a number: ``max_tokens: true``
    or ``stop_token_ids: [true]`` is refused, not read as 1."""

    model_config = ConfigDict(extra="allow")

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is not None and _names_a_number(cls.model_fields[info.field_name].annotation) and \
                _holds_a_boolean(value):
            raise PydanticCustomError("bool_is_not_a_number", "Input should be a number, not a boolean")
        return value

    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or ())


class StreamOptions(ApiModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


MAX_GRAMMAR_CHARS = 65536
MAX_STOP_TOKEN_IDS = 1024


class StructuredOutputs(ApiModel):
    """vLLM's ``structured_outputs``: exactly one of a JSON schema, a regex, a list of choices, an EBNF
    grammar, ``json_object: true`` for any JSON object, or a structural tag (its JSON text). Other fields
    are refused (not ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    choice: list[Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]] | None = Field(None, min_length=1,
                                                                                     max_length=1024)
    grammar: str | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    json_object: bool | None = None
    structural_tag: str | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    disable_any_whitespace: bool = False


class SamplingFields(ApiModel):
    """Fields of both OpenAI endpoints. ``None`` means "the model's generation_config.json default"."""

    model: str | None = Field(None, description="Served model name; omitted means the default model.")
    n: int = Field(1, ge=1, le=INT64_MAX)
    presence_penalty: FiniteFloat = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: FiniteFloat = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: FiniteFloat | None = Field(None, gt=0.0, le=1e6)
    temperature: FiniteFloat | None = Field(None, ge=0.0, le=2.0)
    top_p: FiniteFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)
    min_p: FiniteFloat | None = Field(None, ge=0.0, le=1.0)
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    bad_words: list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[TokenId] | None = None
    logit_bias: dict[str, FiniteFloat] | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=INT64_MAX)
    priority: Int64 = 0
    cache_salt: str | None = Field(None, min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    request_id: str | None = Field(None, max_length=256)
    logits_processors: Any = Field(None, description="Not supported: must be absent.")
    structured_outputs: StructuredOutputs | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT64_MAX)
    return_tokens_as_token_ids: bool = False
