"""Registers ``tokenmill bench serve`` — under an existing ``bench`` command when core or another
plugin already added one, else under a new ``bench`` command. Without ``--peers`` it loads a running
server; with it, it starts tokenmill's and vLLM's servers itself and compares them (ServeComparison)."""

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
    parser.add_argument("--base-url", default=None, help="server URL (default: http://127.0.0.1:8000)")
    parser.add_argument("--model", default=None,
                        help="model name (default: the server's first model); with --peers, the model folder or "
                             ".gguf tokenmill serves (default: the bundled SmolLM2-135M-Instruct GGUF, which vLLM "
                             "gets exported to an fp32 HF folder)")
    parser.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: %(default)s)")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=64, help="output tokens per request (default: %(default)s)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="requests in flight at once (default: all)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (default: all at once)")
    parser.add_argument("--api-key", default=None, help="API key (default: $TOKENMILL_API_KEY)")
    parser.add_argument("--seed", type=int, default=0, help="prompt randomness (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds (with --peers: "
                        "for the whole client run; default: %(default)s)")
    parser.add_argument("--output", default=None, help="also write the JSON report to this file")
    peers = parser.add_argument_group(
        "side by side (--peers)", "start `tokenmill serve` and then vLLM's server from --peer-venv, one at a time, "
        "and load each with vLLM's `vllm bench serve` (tokenmill's own client when the venv lacks vLLM)")
    peers.add_argument("--peers", action="store_true", help="run the side-by-side comparison instead of loading --base-url")
    peers.add_argument("--peer-venv", default=".bench-venv", help="virtual environment holding vLLM (default: %(default)s)")
    peers.add_argument("--engines", default="tokenmill,vllm", help="with --peers: servers to run (default: %(default)s)")
    peers.add_argument("--runs", type=int, default=1,
                       help="with --peers: load each server this many times and report its median run (default: %(default)s)")
    peers.add_argument("--ready-timeout", type=float, default=600.0,
                       help="with --peers: seconds a server may take to answer (default: %(default)s)")
    peers.add_argument("--tokenmill-args", default="", help="with --peers: extra `tokenmill serve` flags, one string")
    peers.add_argument("--vllm-args", default="", help="with --peers: extra `vllm serve` flags, one string")
    peers.add_argument("--work-dir", default=None,
                       help="with --peers: where server and client logs go (default: a new temporary folder)")
    parser.set_defaults(func=run)
    return parser


def _write(report: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(report, indent=2) + "\n")


def run_peers(args: argparse.Namespace) -> int:
    """The side-by-side comparison: print it, write the JSON; 1 when any server failed."""
    import shlex
    import tempfile

    from tokenmill.benchmarks.host import host_record, read_bandwidth
    from tokenmill.benchmarks.peer_venv import PeerVenv
    from tokenmill_server.bench.comparison_report import render
    from tokenmill_server.bench.process_group import exit_on_sigterm
    from tokenmill_server.bench.serve_comparison import ENGINES, ServeComparison
    from tokenmill_server.bench.serve_workload import ServeWorkload

    if args.base_url is not None:
        print("error: --peers starts its own servers on free local ports; drop --base-url", file=sys.stderr)
        return 2
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        print(f"error: --engines takes a comma-separated list of {', '.join(ENGINES)}; got {args.engines!r}",
              file=sys.stderr)
        return 2
    try:
        model = args.model
        if model is None:
            from tokenmill.benchmarks.default_model import bundled_model_path

            model = bundled_model_path()
        extra = {"tokenmill": shlex.split(args.tokenmill_args), "vllm": shlex.split(args.vllm_args)}
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    workload = ServeWorkload(num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                             max_concurrency=args.max_concurrency, request_rate=args.request_rate, seed=args.seed)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tokenmill-bench-serve-")
    comparison = ServeComparison(model, workload, PeerVenv(args.peer_venv), work_dir, ready_timeout=args.ready_timeout,
                                 client_timeout=args.timeout, extra_args=extra, engines=engines,
                                 runs=args.runs)
    host = host_record(model)
    with exit_on_sigterm():
        report = comparison.run()
    host["memory_read_gb_s"].append(read_bandwidth())
    report["host"] = host
    report["work_dir"] = work_dir
    print(render(report))
    _write(report, args.output)
    return 1 if any("error" in r for r in report["servers"].values()) else 0


def run(args: argparse.Namespace) -> int:
    """Run the load and print the report (or, with ``--peers``, the side-by-side comparison)."""
    import asyncio
    import os

    from tokenmill_server.bench.serve_load import LoadConfig, run_load

    if args.peers:
        return run_peers(args)
    config = LoadConfig(base_url=(args.base_url or "http://127.0.0.1:8000").rstrip("/"), model=args.model, num_prompts=args.num_prompts,
                        input_len=args.input_len, output_len=args.output_len, max_concurrency=args.max_concurrency,
                        request_rate=args.request_rate, api_key=args.api_key or os.environ.get("TOKENMILL_API_KEY"),
                        seed=args.seed, timeout=args.timeout)
    try:
        report = asyncio.run(run_load(config))
    except (OSError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    _write(report, args.output)
    return 0 if report["completed"] else 1
