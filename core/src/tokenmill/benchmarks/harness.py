"""The benchmark harness: build a workload once, run each engine on it in its own subprocess, and
report every figure with its ratio to HF transformers, plus whether the greedy outputs agree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from tokenmill.benchmarks.host import describe, float32_stream_rate, reads_float32_weights
from tokenmill.benchmarks.workloads import chat_prompts

WORKLOADS = {
    "W1": {"num_prompts": 64, "output_len": 128},
    "W2": {"num_prompts": 1, "output_len": 256},
}


def build_workload(model: str, name: str, num_prompts: int | None = None, output_len: int | None = None,
                   runs: int = 1) -> dict[str, Any]:
    """Token ids of the workload's chat prompts, rendered with the model's own tokenizer and template;
    every engine times ``runs`` runs of them and reports the median."""
    from tokenmill.tokenizer.chat_template import chat_prompt_token_ids
    from tokenmill.tokenizer.loader import load_tokenizer

    spec = dict(WORKLOADS[name])
    spec["num_prompts"] = num_prompts or spec["num_prompts"]
    spec["output_len"] = output_len or spec["output_len"]
    tokenizer = load_tokenizer(model)
    prompts = [chat_prompt_token_ids(tokenizer, c)[1] for c in chat_prompts(spec["num_prompts"])]
    return {"name": name, "prompts": prompts, "output_len": spec["output_len"], "ttft_prompts": ttft_prompts(prompts[0]),
            "runs": runs}


def ttft_prompts(prompt: list[int], count: int = 5) -> list[list[int]]:
    """The prompts every engine times a first token on, after its run (its TTFT is their median):
    each as long as ``prompt`` but with another first token, so none shares a prefix with the run or
    with another probe (vLLM and tokenmill cache prefixes by default; llama.cpp's high-level API
    reuses its last prompt)."""
    step = -1 if prompt[0] >= count else 1  # stays inside the vocabulary either way
    return [[prompt[0] + step * (index + 1), *prompt[1:]] for index in range(count)]


PEER_SCRIPTS = {"vllm": "vllm_engine.py", "llama.cpp": "llama_cpp_engine.py"}


def run_engine(engine: str, model: str, workload: dict[str, Any], options: dict[str, Any], timeout: float = 1800,
               python: str = sys.executable) -> dict[str, Any]:
    """One engine in a fresh process (its own process group, ended on timeout); errors are recorded, not raised.

    tokenmill and HF run as ``tokenmill.benchmarks.engine_process``; peers run their standalone
    script under their own ``python`` (the .bench-venv)."""
    request = json.dumps({"engine": engine, "model": model, "workload": workload, "options": options})
    if engine in PEER_SCRIPTS:
        command = [python, os.path.join(os.path.dirname(__file__), "peers", PEER_SCRIPTS[engine])]
    else:
        command = [python, "-m", "tokenmill.benchmarks.engine_process"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(request, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    marker = stdout.rfind("@@RESULT@@")
    if process.returncode != 0 or marker < 0:
        tail = (stderr or stdout).strip().splitlines()[-5:]
        return {"error": f"{exit_status(process.returncode)}: " + " | ".join(tail)}
    result = json.loads(stdout[marker + len("@@RESULT@@"):].splitlines()[0])  # engines may print after it
    result["process_s"] = time.perf_counter() - started
    return result


def exit_status(returncode: int) -> str:
    """``exit code N``, or the signal that ended the process (SIGILL: built for another CPU)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = " (illegal instruction: a build for another CPU?)" if name == "SIGILL" else ""
    return f"killed by {name}{hint}"


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, Any]:
    """How many sequences are token-for-token identical, and where the others first differ."""
    same = sum(a == b for a, b in zip(reference, other, strict=True))
    first = [next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
             for a, b in zip(reference, other, strict=True) if a != b]
    return {"identical": same, "total": len(reference), "first_divergence": first}


def compare(results: dict[str, dict[str, Any]], baseline: str = "hf", host: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ratios of every engine's figures to the baseline's, output agreement with it, and each float32
    decode's share of the host's float32 streaming rate (``host.float32_stream_rate``) when known."""
    base = results.get(baseline, {})
    rate = float32_stream_rate(host) if host else None
    summary: dict[str, Any] = {}
    for engine, result in results.items():
        if "error" in result:
            continue
        entry = {}
        if rate is not None and "decode_tok_s" in result and reads_float32_weights(engine, result):
            entry["decode_of_float32_stream_rate"] = result["decode_tok_s"] / rate
        if engine == baseline or "error" in base or not base:
            if entry:
                summary[engine] = entry
            continue
        for key in ("output_tok_s", "decode_tok_s"):
            if key in result and key in base:
                entry[f"{key}_ratio"] = result[key] / base[key]
        if "outputs" in result and "outputs" in base:
            entry["greedy_agreement"] = agreement(base["outputs"], result["outputs"])
        summary[engine] = entry
    return summary


def render(workload: dict[str, Any], results: dict[str, dict[str, Any]], ratios: dict[str, Any],
           host: dict[str, Any] | None = None) -> str:
    """The table: the workload, the host (when probed), then a line per engine."""
    lengths = [len(p) for p in workload["prompts"]]
    lines = [f"{workload['name']}: {len(lengths)} prompt(s) of {min(lengths)}-{max(lengths)} tokens x "
             f"{workload['output_len']} new tokens"]
    if host:
        lines.append(describe(host))
    for engine, result in results.items():
        if "error" in result:
            lines.append(f"  {engine:<10} error: {result['error']}")
            continue
        line = f"  {engine:<10} {result['output_tok_s']:8.1f} output tok/s"
        if "decode_tok_s" in result:
            line += f"  decode {result['decode_tok_s']:6.1f} tok/s  TTFT {result['ttft_s'] * 1000:7.1f} ms"
            if "decode_of_float32_stream_rate" in ratios.get(engine, {}):
                line += f"  ({ratios[engine]['decode_of_float32_stream_rate']:.0%} of the float32 streaming rate)"
        line += f"  (load {result['load_s']:.1f} s)"
        if len(result.get("runs_output_tok_s", ())) > 1:
            line += f"  (median of {len(result['runs_output_tok_s'])} runs: " + ", ".join(
                f"{x:.1f}" for x in result["runs_output_tok_s"]) + ")"
            if not result.get("runs_identical", True):
                line += "  runs differ"
        extra = ratios.get(engine, {})
        if "output_tok_s_ratio" in extra:
            line += f"  x{extra['output_tok_s_ratio']:.2f} vs hf"
        if "greedy_agreement" in extra:
            agree = extra["greedy_agreement"]
            line += f"  identical {agree['identical']}/{agree['total']}"
        if result.get("linear_kernels"):
            line += f"  [{', '.join(result['linear_kernels'])}]"
        if "speculative" in result:
            spec = result["speculative"]
            line += (f"  speculative: {spec['accepted_tokens']}/{spec['draft_tokens']} drafts accepted"
                     f"{' [draft: ' + ', '.join(spec['draft_linear_kernels']) + ']' if spec['draft_linear_kernels'] else ''}")
        lines.append(line)
    return "\n".join(lines)
