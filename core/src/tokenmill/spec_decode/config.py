"""SpeculativeConfig: what ``--speculative-config`` asks for, parsed and checked once.

Two ways to propose draft tokens, both verified by the target model in one forward pass so the
output is exactly what the target alone would produce (greedy requests):

* ``draft_model``: a second copy of the model that runs faster, by default the target's own
  checkpoint loaded another way (``quantization_config`` merged into its config, e.g.
  ``{"gguf_mode": "packed"}`` to read a GGUF's 4-bit blocks in place, or another ``dtype`` /
  ``quantization``). It shares the target's KV cache (its keys and values for the verified tokens
  are the target's), so it must have the target's attention layout.
* ``ngram``: prompt lookup, no model: the tokens that followed the latest earlier occurrence of
  the sequence's last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

METHODS = ("draft_model", "ngram")
MAX_SPECULATIVE_TOKENS = 16
_KEYS = {"method", "num_speculative_tokens", "model", "quantization", "dtype", "quantization_config",
         "prompt_lookup_min", "prompt_lookup_max"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """Validated speculative-decoding settings (vLLM's names where vLLM has them)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None  # draft_model: the draft's checkpoint (default: the target's)
    quantization: str | None = None  # draft_model: force the draft's quantization format
    dtype: str | None = None  # draft_model: the draft's compute dtype (default: the target's)
    quantization_config: Mapping[str, Any] = field(default_factory=dict)  # merged into the draft's config
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | None) -> SpeculativeConfig | None:
        """From a JSON object (string or mapping); None for None or ``""``. ValueError names what is wrong."""
        if value is None or value == "":
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"--speculative-config is not valid JSON: {error}") from None
        if not isinstance(value, Mapping):
            raise ValueError("--speculative-config must be a JSON object, e.g. "
                             '{"method": "ngram", "num_speculative_tokens": 4}')
        unknown = set(value) - _KEYS
        if unknown:
            raise ValueError(f"--speculative-config: unknown key(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_KEYS))})")
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(f"--speculative-config: method must be one of {', '.join(METHODS)}, got {method!r}")
        count = value.get("num_speculative_tokens")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--speculative-config: num_speculative_tokens must be an integer from 1 to "
                             f"{MAX_SPECULATIVE_TOKENS}, got {count!r}")
        options = value.get("quantization_config") or {}
        if not isinstance(options, Mapping):
            raise ValueError("--speculative-config: quantization_config must be a JSON object")
        config = cls(method=method, num_speculative_tokens=count, model=value.get("model"),
                     quantization=value.get("quantization"), dtype=value.get("dtype"),
                     quantization_config=dict(options),
                     prompt_lookup_min=value.get("prompt_lookup_min", cls.prompt_lookup_min),
                     prompt_lookup_max=value.get("prompt_lookup_max", cls.prompt_lookup_max))
        config._check_method_fields(value)
        return config

    def _check_method_fields(self, given: Mapping[str, Any]) -> None:
        lookup = {"prompt_lookup_min", "prompt_lookup_max"}
        draft = {"model", "quantization", "dtype", "quantization_config"}
        misplaced = (lookup if self.method == "draft_model" else draft) & set(given)
        if misplaced:
            raise ValueError(f"--speculative-config: {', '.join(sorted(misplaced))} do not apply to method "
                             f"{self.method!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        for name, number in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                raise ValueError(f"--speculative-config: {name} must be a positive integer, got {number!r}")
        if low > high:
            raise ValueError(f"--speculative-config: prompt_lookup_min ({low}) is larger than prompt_lookup_max ({high})")
        for name in ("model", "quantization", "dtype"):
            text = getattr(self, name)
            if text is not None and (not isinstance(text, str) or not text):
                raise ValueError(f"--speculative-config: {name} must be a non-empty string, got {text!r}")

    def describe(self) -> str:
        """One line for the startup report."""
        if self.method == "ngram":
            return (f"speculative decoding: ngram prompt lookup ({self.prompt_lookup_min}..{self.prompt_lookup_max} "
                    f"tokens), {self.num_speculative_tokens} draft tokens a step, verified by the model")
        how = ", ".join(f"{k}={v}" for k, v in (("quantization", self.quantization), ("dtype", self.dtype),
                                                ("quantization_config", dict(self.quantization_config) or None))
                        if v)
        return (f"speculative decoding: draft model {self.model or 'the target checkpoint'}"
                f"{f' ({how})' if how else ''}, {self.num_speculative_tokens} draft tokens a step, verified by the model")
