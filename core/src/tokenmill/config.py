"""Engine configuration: user arguments (EngineArgs) resolved once into a frozen EngineConfig.

Every automatic choice made during resolution is recorded with its reason in
``EngineConfig.report`` and printed at startup; components receive only their slice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
               "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def parse_size(value: int | float | str | None) -> int | None:
    """Bytes from ``4GiB``, ``512MB``, ``2g`` or a plain number of bytes; None stays None."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot read {value!r} as a size: use a number of bytes or e.g. 4GiB, 512MiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


@dataclass
class EngineArgs:
    """Everything a user can set, with vLLM's names. ``None`` / "auto" means "choose for me"."""

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    device: str | None = None
    allow_cpu_fallback: bool = False
    allow_attention_fallback: bool = False  # pass over a broken preferred attention backend (with a warning)
    attention_backend: str | None = None
    quantization: str | None = None
    seed: int = 0
    generation_config: str = "auto"  # "auto": the model's generation_config.json defaults; "none": ignore it
    max_logprobs: int = 20
    chat_template: str | None = None
    served_model_name: str | None = None
    num_threads: int | None = None
    enforce_eager: bool = False  # never capture graphs, even where the platform can
    speculative_config: str | dict[str, Any] | None = None  # JSON object: see tokenmill.spec_decode.config

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineArgs:
        unknown = set(kwargs) - cls.field_names()
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
        return cls(**kwargs)


@dataclass(frozen=True)
class ModelConfig:
    """The model as resolved: where it is, its HF config, dtype and length limits."""

    path: str
    tokenizer_path: str
    architecture: str
    hf_config: Any  # transformers.PretrainedConfig
    dtype: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    generation_defaults: dict[str, Any]
    served_model_name: str
    quantization: str
    chat_template: str | None = None

    @property
    def hidden_size(self) -> int:
        """The width of the model's hidden states, which every pooling method keeps (0 when the config
        does not say)."""
        text_config = self.hf_config.get_text_config() if hasattr(self.hf_config, "get_text_config") else self.hf_config
        return int(getattr(text_config, "hidden_size", 0) or 0)


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size, number of blocks and their dtype."""

    block_size: int
    num_blocks: int
    kv_cache_dtype: str
    bytes_per_block: int
    enable_prefix_caching: bool

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


@dataclass(frozen=True)
class EngineConfig:
    """The frozen result of resolving EngineArgs; ``report`` lists every automatic choice."""

    model: ModelConfig
    cache: CacheConfig
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    scheduling_policy: str
    seed: int
    max_logprobs: int
    num_threads: int | None
    selection: Any  # tokenmill.discovery SelectionReport
    report: tuple[str, ...] = field(default=())
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None  # set: size the KV cache again after a profiling step
    speculative: Any = None  # tokenmill.spec_decode.config.SpeculativeConfig, or None: decode one token a step

    def render_report(self) -> str:
        return "\n".join(self.report)
