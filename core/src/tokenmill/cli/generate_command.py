"""``tokenmill generate``: complete a prompt (or chat) from the command line."""

from __future__ import annotations

import argparse
from typing import Any

from tokenmill.plugin_api import hookimpl


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``generate``."""
    from tokenmill.cli.engine_flags import add_engine_flags

    parser = subparsers.add_parser("generate", help="generate text for one or more prompts")
    parser.add_argument("model", nargs="?", help="model directory or .gguf (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("-p", "--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--chat", action="store_true", help="send each prompt as a user message through the chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    add_engine_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, generate, print each completion."""
    import logging

    from tokenmill.benchmarks.default_model import bundled_model_path
    from tokenmill.cli.engine_flags import engine_args_from
    from tokenmill.llm import LLM
    from tokenmill.sampling_params import SamplingParams

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    llm = LLM.from_engine_args(engine_args_from(args, model=args.model or bundled_model_path()))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sampling_seed)
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params)
    else:
        outputs = llm.generate(args.prompt, params)
    for output in outputs:
        print(output.outputs[0].text)
        print("---")
    return 0
