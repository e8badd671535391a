"""``tokenmill plugins explain [--model M]``: a dry run of platform -> attention backend ->
quantization format -> kernels, with every rejection reason. Nothing is loaded but the config.
Without ``--model`` it explains the bundled SmolLM2-135M-Instruct GGUF, the model ``generate`` runs."""

from __future__ import annotations

import argparse
from typing import Any

from tokenmill.discovery import ModelDescription, SelectionRequest, select


def add_parser(actions: Any) -> None:
    """Add the ``explain`` action under ``tokenmill plugins``."""
    parser = actions.add_parser("explain", help="dry-run selection for a model and show every reason",
                                description="Show which platform, attention backend, quantization format and "
                                            "kernels a model would get, and why every other candidate was rejected.")
    parser.add_argument("--model", default=None, help="model directory (with config.json) or .gguf file "
                                                      "(default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="compute dtype (default: auto)")
    parser.add_argument("--quantization", default=None, help="force a quantization format")
    parser.add_argument("--device", default=None, help="pin the platform: NAME or NAME:INDEX (default: best score)")
    parser.add_argument("--attention-backend", default=None, help="force an attention backend")
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV-cache dtype (default: auto)")
    parser.add_argument("--block-size", type=int, default=16, help="KV-cache block size in tokens (default: 16)")
    parser.add_argument("--allow-cpu-fallback", action="store_true",
                        help="continue past broken accelerator plugins (reported as warnings)")
    parser.add_argument("--allow-attention-fallback", action="store_true",
                        help="pass over broken preferred attention backends (reported as warnings)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the selection report; a SelectionError is reported by the CLI's main, a missing bundled
    model is one error line."""
    import sys

    from tokenmill.benchmarks.default_model import bundled_model_path

    request = SelectionRequest(device=args.device, allow_cpu_fallback=args.allow_cpu_fallback,
                               allow_attention_fallback=args.allow_attention_fallback,
                               attention_backend=args.attention_backend, quantization=args.quantization,
                               dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size)
    try:
        path = args.model or bundled_model_path()
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    model = ModelDescription.load(args.registry, path)
    print(f"model: {model.model_path} (config from {model.source})")
    print(f"implementation: {model.implementation()}")
    print(select(args.registry, request, model).render())
    return 0
