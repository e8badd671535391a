"""The host a benchmark ran on, and the float32 streaming rate its memory sets.

A single-stream decode reads every weight it multiplies once per token, so on a CPU its speed is
bounded by memory read bandwidth over the bytes it reads. The bandwidth of shared and virtual machines
varies from hour to hour, so it is measured in the run itself,
before and after the engines, and every W2 float32 figure is also given as a share of the float32
streaming rate of that moment: the tokens/s at which that bandwidth reads the model's float32 weights
once. An engine near it cannot be made several times faster while it reads them all. It is not a hard
limit: torch's sum, the probe, reads somewhat below the best kernels, and tokenmill's greedy head reads
an int8 estimate of the LM head plus the float32 rows still in contention, not the whole float32 head.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

READ_BYTES = 512 << 20  # well past any last-level cache the benchmarks meet, and quick to read
READ_REPEATS = 5
FLOAT32_BYTES = 4


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_bandwidth(nbytes: int = READ_BYTES, repeats: int = READ_REPEATS) -> float:
    """Memory read bandwidth in GB/s: the best of ``repeats`` sums over ``nbytes`` of float32 with
    torch's threads (a streaming read, as a decode step's weights are)."""
    import torch

    values = torch.ones(max(1, nbytes // FLOAT32_BYTES), dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        values.sum()
        best = min(best, time.perf_counter() - started)
    return values.numel() * FLOAT32_BYTES / best / 1e9


def float32_decode_bytes(model: str) -> int:
    """Bytes of float32 weights one decode step reads: every parameter of the model (built on the meta
    device from its config, so nothing is loaded), less the input embedding unless the LM head shares
    it (a step gathers one row of it, but multiplies the whole head)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if model.endswith(".gguf"):
        config = AutoConfig.from_pretrained(os.path.dirname(model) or ".", gguf_file=os.path.basename(model))
    else:
        config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in skeleton.parameters())  # a tied head is one parameter, counted once
    embedding, head = skeleton.get_input_embeddings(), skeleton.get_output_embeddings()
    if head is None or head.weight is not embedding.weight:
        count -= embedding.weight.numel()
    return count * FLOAT32_BYTES


def host_record(model: str) -> dict[str, Any]:
    """The CPU, torch's kernel ISA, a first bandwidth reading and the model's float32 decode bytes (or
    why they could not be counted)."""
    import torch

    record: dict[str, Any] = {"cpu": cpu_name(), "machine": platform.machine(), "logical_cpus": os.cpu_count(),
                              "torch_threads": torch.get_num_threads(),
                              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                              "memory_read_gb_s": [read_bandwidth()]}
    try:
        record["float32_decode_bytes"] = float32_decode_bytes(model)
    except Exception as error:  # an architecture transformers cannot build: the rate is left out
        record["float32_decode_bytes_error"] = f"{type(error).__name__}: {error}"
    return record


def float32_stream_rate(record: dict[str, Any]) -> float | None:
    """Tokens/s at which the fastest bandwidth reading reads the float32 weights once, or None without the
    byte count."""
    weight_bytes = record.get("float32_decode_bytes")
    if not weight_bytes or not record.get("memory_read_gb_s"):
        return None
    return max(record["memory_read_gb_s"]) * 1e9 / weight_bytes


def reads_float32_weights(engine: str, result: dict[str, Any]) -> bool:
    """Whether an engine's W2 decode streams the float32 weights the rate counts: HF and vLLM here, and
    tokenmill unless it reads packed quantized blocks or decodes speculatively (several tokens a read)."""
    if engine in ("hf", "vllm"):
        return True
    if engine != "tokenmill" or "speculative" in result:
        return False
    return not any("packed" in kernel for kernel in result.get("linear_kernels", ()))


def describe(record: dict[str, Any]) -> str:
    """One line for the benchmark table."""
    readings = ", ".join(f"{r:.1f}" for r in record.get("memory_read_gb_s", ()))
    line = (f"host: {record['cpu']} ({record['machine']}, {record['logical_cpus']} logical CPUs, torch "
            f"{record['torch_threads']} threads, {record['torch_cpu_capability']}); memory reads {readings} GB/s")
    rate = float32_stream_rate(record)
    if rate is not None:
        line += (f"; float32 streaming rate {rate:.1f} tok/s "
                 f"({record['float32_decode_bytes'] / 1e6:.0f} MB of weights a token)")
    return line
