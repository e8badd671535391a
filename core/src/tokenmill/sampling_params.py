"""SamplingParams: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace

from tokenmill.structured.params import StructuredOutputsParams


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput carries: everything so far, only the new part, or only the end."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """Sampling and stopping settings of one request. Validated on construction."""

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)
    # bad_words as token sequences; the front end fills it once per request (tokenizer.bad_words_token_ids)
    bad_words_token_ids: list[list[int]] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # the output must match a JSON schema, regex, choice or grammar (see StructuredOutputsParams)
    structured_outputs: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if self.bad_words_token_ids is not None:
            self.bad_words_token_ids = [[int(t) for t in word] for word in self.bad_words_token_ids]
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self._validate()

    def _validate(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(self.n >= 1, f"n must be at least 1, got {self.n}.")
        if self.best_of is not None:
            check(self.best_of >= self.n, f"best_of must be greater than or equal to n, got n={self.n} and best_of={self.best_of}.")
        check(-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        check(-2.0 <= self.frequency_penalty <= 2.0, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        check(self.repetition_penalty > 0.0, f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        check(self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}.")
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}.")
        check(self.top_k >= 0, f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None:
            check(self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}.")
        check(self.min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None:
            check(self.min_tokens <= self.max_tokens, f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.")
        if self.logprobs is not None:
            check(self.logprobs >= 0, f"logprobs must be non-negative, got {self.logprobs}.")
        if self.prompt_logprobs is not None:
            check(self.prompt_logprobs >= 0, f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}.")
        check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings.")
        check(self.detokenize or not self.stop, "stop strings are only supported when detokenize is True.")
        if self.bad_words_token_ids is not None:
            check(all(self.bad_words_token_ids), "bad_words_token_ids must not contain empty sequences.")
        if self.allowed_token_ids is not None:
            check(len(self.allowed_token_ids) > 0, "allowed_token_ids is not allowed to be empty.")

    def check_token_ids(self, vocab_size: int) -> None:
        """Raise ValueError when a token id named in these params is outside ``[0, vocab_size)``."""
        named = {
            "logit_bias": list(self.logit_bias or ()),
            "allowed_token_ids": self.allowed_token_ids or [],
            "stop_token_ids": self.stop_token_ids,
            "bad_words": [t for word in self.bad_words_token_ids or () for t in word],
        }
        for name, token_ids in named.items():
            bad = [t for t in token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} contains token ids outside the vocabulary [0, {vocab_size}): {bad[:10]}.")

    @property
    def greedy(self) -> bool:
        """Whether the argmax is taken (temperature 0)."""
        return self.temperature < _GREEDY_EPS

    @property
    def num_candidates(self) -> int:
        """How many sequences are sampled (best_of when set, else n)."""
        return self.best_of or self.n

    def clone(self, **changes: object) -> SamplingParams:
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
