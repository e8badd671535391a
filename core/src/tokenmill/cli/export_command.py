"""``tokenmill export MODEL OUT_DIR``: a self-contained checkpoint file (the bundled SmolLM2 GGUF, any
``.gguf``) written as a float Hugging Face directory, the input ``tokenmill quantize`` takes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tokenmill.plugin_api import hookimpl


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``export``."""
    parser = subparsers.add_parser(
        "export", help="write a .gguf as a float Hugging Face checkpoint (config.json + safetensors)",
        description="Write a self-contained checkpoint file (e.g. a .gguf) as a float Hugging Face model directory: "
                    "config.json, safetensors and the tokenizer. The weights are the file's dequantized values; "
                    "the output loads with tokenmill and transformers and is what `tokenmill quantize` reads.")
    parser.add_argument("model", nargs="?", help="checkpoint file (default: the bundled SmolLM2-135M-Instruct GGUF)")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="output directory (created; must hold no weights)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the written weights (default: float32)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export, then print what was written; a file no format reads is one error line and exit 1."""
    from tokenmill.benchmarks.default_model import bundled_model_path
    from tokenmill.quantize.float_export import export_float_checkpoint

    try:
        model = args.model or bundled_model_path()
        out = export_float_checkpoint(args.registry, model, args.out_dir, args.dtype)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in Path(out).glob("*.safetensors"))
    print(f"wrote {out}: {Path(model).name} as {args.dtype} safetensors ({size / 2**20:.1f} MiB) with config.json "
          f"and tokenizer")
    return 0
