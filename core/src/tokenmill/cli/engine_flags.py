"""Command-line flags for every EngineArgs field (``--max-num-seqs``, ``--no-enable-prefix-caching``, ...),
shared by ``generate``, ``bench`` and ``serve`` so every command accepts the same engine settings."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from tokenmill.config import EngineArgs

_HELP = {
    "dtype": "compute dtype: auto, float32, float16, bfloat16",
    "kv_cache_memory": "KV-cache size, e.g. 4GiB (default: chosen by the platform)",
    "device": "pin a platform/device, e.g. cpu, cuda, cuda:1 (also TOKENMILL_DEVICE)",
    "allow_cpu_fallback": "run on the CPU when an installed accelerator plugin is broken",
    "allow_attention_fallback": "use the platform's next attention backend (or core's reference one) when a "
                                "preferred backend is broken or none serves the model; reported at startup",
    "generation_config": "'auto' applies the model's generation_config.json sampling defaults, 'none' ignores it",
    "speculative_config": "speculative decoding as a JSON object, e.g. '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 4}' or '{\"method\": \"draft_model\", \"num_speculative_tokens\": 4, "
                          "\"quantization_config\": {\"gguf_mode\": \"packed\"}}' (greedy requests; outputs unchanged)",
}


def add_engine_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ("model",)) -> None:
    """Add one flag per EngineArgs field (except ``skip``), defaulting to EngineArgs' defaults."""
    hints = typing.get_type_hints(EngineArgs)
    group = parser.add_argument_group("engine")
    for field in dataclasses.fields(EngineArgs):
        if field.name in skip:
            continue
        flag = "--" + field.name.replace("_", "-")
        hint = hints[field.name]
        help_text = _HELP.get(field.name)
        if hint is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default, help=help_text)
            continue
        kind = next((t for t in typing.get_args(hint) if t in (int, float)), hint if hint in (int, float) else str)
        if field.name == "kv_cache_memory":
            kind = str
        group.add_argument(flag, type=kind, default=field.default, help=help_text)


def engine_args_from(args: argparse.Namespace, **overrides: object) -> EngineArgs:
    """EngineArgs from parsed flags (fields missing from ``args`` keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs) if hasattr(args, f.name)}
    values.update(overrides)
    return EngineArgs(**values)
