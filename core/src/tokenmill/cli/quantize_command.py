"""``tokenmill quantize MODEL_DIR OUT_DIR --format F``: rewrite a float Hugging Face checkpoint in a
quantization format, by the format plugin's own ``quantize_checkpoint`` (written with ``tokenmill.plugin_api.quantize_tools``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tokenmill.plugin_api import hookimpl

DESCRIPTION = """\
Quantize the decoder linear layers of a float Hugging Face checkpoint (config.json + safetensors);
embeddings, the LM head and norms stay in float, tokenizer files are copied. Calibrated methods run
the model layer by layer on calibration text (built-in English prose, or --calibration-file), each
layer seeing the outputs of the already-quantized layers before it.

  gptq  2/3/4/8-bit integers with group scales, GPTQ v1 layout. --method gptq (default): GPTQ's
        Hessian-based error feedback, with damping (--damp) and optional act order (--desc-act);
        --method rtn: round to nearest.
  awq   4-bit AWQ GEMM layout. --method awq (default): AWQ's activation-aware scale search (scales
        folded into the norms / previous linears, chosen on the linears' output error), then
        round to nearest; --method rtn: round to nearest only. Needs a llama-style layer layout.
  fp8   e4m3 weights with per-channel scales (--weight-block-size N: N x N block scales, the layout
        transformers reads too), dynamic activation scales. --method rtn (default) or gptq (the
        same error feedback as GPTQ, on the e4m3 grid).
  int8  symmetric per-channel int8; --activations none (W8A16, default) or dynamic (W8A8).

Each format accepts only its own options; the output loads with tokenmill (--model OUT_DIR).
"""


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``quantize``."""
    parser = subparsers.add_parser("quantize", help="quantize a float checkpoint (gptq, awq, fp8, int8)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="float Hugging Face model directory")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="output directory (created; must hold no weights)")
    parser.add_argument("--format", required=True, dest="format_name", metavar="FORMAT",
                        help="gptq, awq, fp8, int8 (any installed format that writes checkpoints)")
    option = argparse.SUPPRESS  # only the options given are passed on, so each format keeps its own defaults
    parser.add_argument("--bits", type=int, default=option, help="bits per weight (gptq: 2, 3, 4, 8; awq: 4)")
    parser.add_argument("--group-size", type=int, default=option,
                        help="inputs sharing a scale and zero point (default 128; gptq: -1 = per column)")
    parser.add_argument("--method", choices=("rtn", "gptq", "awq"), default=option,
                        help="rtn (gptq, awq, fp8), gptq (gptq, fp8) or awq (awq); defaults: see above")
    parser.add_argument("--sym", action=argparse.BooleanOptionalAction, default=option,
                        help="gptq: symmetric (default) or asymmetric zero points")
    parser.add_argument("--desc-act", action="store_true", default=option,
                        help="gptq, fp8: act order, columns by decreasing Hessian diagonal (needs --method gptq)")
    parser.add_argument("--damp", type=float, default=option, help="gptq, fp8: Hessian damping, a fraction of its "
                                                                    "mean diagonal (default 0.1)")
    parser.add_argument("--calibration-file", default=option, help="UTF-8 text to calibrate on (default: "
                                                                   "built-in English prose)")
    parser.add_argument("--calibration-sequences", type=int, default=option,
                        help="calibration windows (default 16)")
    parser.add_argument("--calibration-length", type=int, default=option,
                        help="tokens per calibration window (default 128)")
    parser.add_argument("--weight-block-size", type=int, default=option, help="fp8: N x N block scales")
    parser.add_argument("--activations", choices=("none", "dynamic"), default=option,
                        help="int8: weight-only (none, default) or per-token int8 activations (dynamic)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Quantize, then print the config written and the sizes; a bad model or option is one error line."""
    from tokenmill.quantize import quantize_model

    fixed = {"model_dir", "out_dir", "format_name", "func", "command", "registry", "plugin_manager"}
    options = {name: value for name, value in vars(args).items() if name not in fixed}
    started = time.perf_counter()
    try:
        config = quantize_model(args.registry, args.format_name, args.model_dir, args.out_dir, **options)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started
    before, after = _weight_bytes(Path(args.model_dir)), _weight_bytes(Path(args.out_dir))
    settings = ", ".join(f"{key}={value}" for key, value in config.items() if key != "quant_method")
    print(f"wrote {args.out_dir}: {config['quant_method']} ({settings})")
    print(f"weights: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB ({after / before:.1%}) in {elapsed:.1f} s")
    return 0


def _weight_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))
