"""``tokenmill generate``: complete a prompt (or chat) from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tokenmill.plugin_api import hookimpl


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``generate``."""
    from tokenmill.cli.engine_flags import add_engine_flags
    from tokenmill.log_level import add_log_level_flag

    parser = subparsers.add_parser("generate", help="generate text for one or more prompts")
    parser.add_argument("model", nargs="?", help="model directory or .gguf (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("-p", "--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    parser.add_argument("--chat", action="store_true", help="send each prompt as a user message through the chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", metavar="SCHEMA", help="the output must be JSON matching this schema "
                            "(its JSON text, or @FILE)")
    constraint.add_argument("--regex", help="the output must match this regular expression")
    constraint.add_argument("--choice", action="append", help="the output must be one of these (repeat)")
    add_engine_flags(parser)
    add_log_level_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, generate, print each completion."""
    import logging

    from tokenmill.benchmarks.default_model import bundled_model_path
    from tokenmill.cli.engine_flags import engine_args_from
    from tokenmill.llm import LLM
    from tokenmill.log_level import apply_log_level
    from tokenmill.sampling_params import SamplingParams

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    apply_log_level(args.log_level)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.sampling_seed, structured_outputs=_constraint(args))
        if params.structured_outputs is not None:
            params.structured_outputs.check_grammar()
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    llm = LLM.from_engine_args(engine_args_from(args, model=args.model or bundled_model_path()))
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params)
    else:
        outputs = llm.generate(args.prompt, params)
    for output in outputs:
        print(output.outputs[0].text)
        print("---")
    return 0


def _constraint(args: argparse.Namespace) -> dict[str, Any] | None:
    """The structured-output constraint the flags ask for (a schema given as @FILE is read from it)."""
    if args.json_schema is not None:
        schema = args.json_schema
        return {"json": Path(schema[1:]).read_text() if schema.startswith("@") else schema}
    if args.regex is not None:
        return {"regex": args.regex}
    if args.choice:
        return {"choice": list(args.choice)}
    return None
