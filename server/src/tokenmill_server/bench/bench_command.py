"""Registers ``tokenmill bench serve`` — under an existing ``bench`` command when core or another
plugin already added one, else under a new ``bench`` command."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _bench_actions(subparsers: Any) -> Any:
    """The sub-command action of ``tokenmill bench``, created when there is none yet."""
    parser = subparsers.choices.get("bench")
    if parser is None:
        parser = subparsers.add_parser("bench", help="benchmarks", description="Benchmarks.")
        parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    for action in parser._actions:  # argparse keeps sub-command actions only here
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="bench_command", metavar="BENCHMARK")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench serve``."""
    parser = _bench_actions(subparsers).add_parser(
        "serve", help="load-test a running server's /v1/completions (streaming)",
        description="Send NUM_PROMPTS streaming completions of INPUT_LEN prompt tokens and OUTPUT_LEN output tokens "
                    "(ignore_eos) and report requests/s, output tokens/s, TTFT and TPOT percentiles as JSON.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server URL (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model name (default: the server's first model)")
    parser.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: %(default)s)")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=64, help="output tokens per request (default: %(default)s)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="requests in flight at once (default: all)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (default: all at once)")
    parser.add_argument("--api-key", default=None, help="API key (default: $TOKENMILL_API_KEY)")
    parser.add_argument("--seed", type=int, default=0, help="prompt randomness (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--output", default=None, help="also write the JSON report to this file")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the load and print the report."""
    import asyncio
    import os

    from tokenmill_server.bench.serve_load import LoadConfig, run_load

    config = LoadConfig(base_url=args.base_url.rstrip("/"), model=args.model, num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len, max_concurrency=args.max_concurrency,
                        request_rate=args.request_rate, api_key=args.api_key or os.environ.get("TOKENMILL_API_KEY"),
                        seed=args.seed, timeout=args.timeout)
    try:
        report = asyncio.run(run_load(config))
    except (OSError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    return 0 if report["completed"] else 1
