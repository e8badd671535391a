"""vLLM's own load client, ``vllm bench serve``, run from the peer venv against any OpenAI-compatible
server: its command line, its run, and its result JSON turned into the comparison's figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenmill.benchmarks.peer_venv import PeerVenv
from tokenmill_server.bench.process_group import ProcessGroup
from tokenmill_server.bench.serve_workload import ServeWorkload

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
RESULT_FILENAME = "vllm-bench-serve.json"
# Shutdown noise of triton's bindings in the peer venv, which would hide the real last lines of a log.
LOG_NOISE = ("nanobind:", "- leaked", "See https://nanobind")


def client_env() -> dict[str, str]:
    """Environment of the client: no hub access (the tokenizer is a local folder), no usage reports."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def client_command(peers: PeerVenv, base_url: str, model: str, tokenizer: str, workload: ServeWorkload,
                   result_dir: str) -> list[str]:
    """``vllm bench serve`` for ``workload``: random prompts of exact lengths made with ``tokenizer``,
    greedy, ignore_eos, streamed /v1/completions; the result JSON (per-request detail included) goes to
    ``result_dir/RESULT_FILENAME``."""
    rate = "inf" if workload.request_rate == float("inf") else str(workload.request_rate)
    args = ["bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base_url,
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(workload.input_len), "--random-output-len", str(workload.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(workload.num_prompts), "--request-rate", rate,
            "--ignore-eos", "--temperature", "0", "--seed", str(workload.seed),
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES)),
            "--ready-check-timeout-sec", "60", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", result_dir, "--result-filename", RESULT_FILENAME]
    if workload.max_concurrency:
        args += ["--max-concurrency", str(workload.max_concurrency)]
    return peers.script_command("vllm_cli.py", *args)


def _metric(data: dict[str, Any], name: str) -> dict[str, float]:
    figures = {"mean": data.get(f"mean_{name}_ms")}
    figures.update({f"p{p}": data.get(f"p{p}_{name}_ms") for p in PERCENTILES})
    return {k: float(v) for k, v in figures.items() if v is not None}


def parse_result(data: dict[str, Any]) -> dict[str, Any]:
    """The figures of one ``vllm bench serve`` result JSON, under the names the comparison uses."""
    try:
        duration = float(data["duration"])
        figures: dict[str, Any] = {
            "completed": int(data["completed"]), "failed": int(data.get("failed", 0)), "duration_s": duration,
            "requests_per_s": float(data["request_throughput"]), "output_tok_s": float(data["output_throughput"]),
            "total_tok_s": float(data["total_token_throughput"]),
            "total_input_tokens": int(data["total_input_tokens"]), "total_output_tokens": int(data["total_output_tokens"]),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"vllm bench serve's result lacks {error}: keys {sorted(data)[:30]}") from None
    for name in METRICS:
        figures[f"{name}_ms"] = _metric(data, name)
    if data.get("max_output_tokens_per_s") is not None:
        figures["peak_output_tok_s"] = float(data["max_output_tokens_per_s"])
    errors: dict[str, int] = {}
    for error in data.get("errors") or []:
        if error:
            key = str(error).strip().splitlines()[-1][:300] if str(error).strip() else "unknown"
            errors[key] = errors.get(key, 0) + 1
    figures["errors"] = errors
    return figures


def run_client(peers: PeerVenv, base_url: str, model: str, tokenizer: str, workload: ServeWorkload,
               work_dir: str | Path, timeout: float = 1800.0) -> dict[str, Any]:
    """Run ``vllm bench serve`` in its own process group and return its figures; RuntimeError (with the
    client's last log lines) when it fails or runs past ``timeout`` seconds."""
    work_dir = Path(work_dir)
    result_path = work_dir / RESULT_FILENAME
    result_path.unlink(missing_ok=True)
    command = client_command(peers, base_url, model, tokenizer, workload, str(work_dir))
    group = ProcessGroup(command, work_dir / "vllm-bench-serve.log", env=client_env())
    try:
        code = group.wait(timeout)
    finally:
        group.stop()
    if code != 0:
        raise RuntimeError(f"vllm bench serve exited with code {code}: {group.log_tail(ignore=LOG_NOISE)}")
    if not result_path.exists():
        raise RuntimeError(f"vllm bench serve wrote no {result_path}: {group.log_tail(ignore=LOG_NOISE)}")
    return parse_result(json.loads(result_path.read_text()))
