"""The load client behind ``tokenmill bench serve``: streaming /v1/completions requests with exact
prompt lengths (token-id prompts) and ignore_eos, timed per chunk."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

_SEED_TEXT = ("The quick brown fox jumps over the lazy dog while the engine serves many requests at once, "
              "counting every token it reads and writes.")


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    model: str | None = None
    num_prompts: int = 100
    input_len: int = 128
    output_len: int = 64
    max_concurrency: int | None = None
    request_rate: float = float("inf")
    api_key: str | None = None
    seed: int = 0
    timeout: float = 600.0


@dataclass
class RequestResult:
    """One request's timing: time to first token, gaps between chunks, tokens, success."""

    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    chunk_gaps: list[float] = field(default_factory=list)
    error: str | None = None


def percentiles(values: list[float]) -> dict[str, float]:
    """mean, p50, p90 and p99 in milliseconds."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000

    return {"mean": statistics.fmean(values) * 1000, "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


async def _prompts(client: httpx.AsyncClient, config: LoadConfig, model: str) -> list[list[int]]:
    response = await client.post("/tokenize", json={"model": model, "prompt": _SEED_TEXT, "add_special_tokens": False})
    response.raise_for_status()
    pool = response.json()["tokens"]
    rng = random.Random(config.seed)
    # every token drawn on its own (as vLLM's random dataset draws ids): windows of one short text
    # repeated prompts, and the prefix cache then answered most of the load's prefill
    return [[rng.choice(pool) for _ in range(config.input_len)] for _ in range(config.num_prompts)]


async def _one(client: httpx.AsyncClient, model: str, prompt: list[int], config: LoadConfig) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": config.output_len, "ignore_eos": True, "stream": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body, timeout=config.timeout) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - started
                    else:
                        result.chunk_gaps.append(now - last)
                    last = now
        result.latency = time.perf_counter() - started
        result.ok = True
    except httpx.HTTPError as error:
        result.error = type(error).__name__
    return result


async def run_load(config: LoadConfig) -> dict[str, Any]:
    """Send the load and summarise it."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=config.max_concurrency or config.num_prompts, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=config.base_url, headers=headers, limits=limits, timeout=60.0) as client:
        model = config.model
        if model is None:
            models = (await client.get("/v1/models")).raise_for_status().json()["data"]
            model = models[0]["id"]
        prompts = await _prompts(client, config, model)
        gate = asyncio.Semaphore(config.max_concurrency or len(prompts) or 1)
        rng = random.Random(config.seed + 1)

        async def limited(prompt: list[int]) -> RequestResult:
            async with gate:
                return await _one(client, model, prompt, config)

        started = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.ensure_future(limited(prompt)))
            if config.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(config.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - started
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    return {"model": model, "num_prompts": config.num_prompts, "input_len": config.input_len,
            "output_len": config.output_len, "max_concurrency": config.max_concurrency, "completed": len(done),
            "failed": len(results) - len(done), "errors": errors, "duration_s": duration,
            "requests_per_s": len(done) / duration if duration else 0.0,
            "input_tokens_per_s": len(done) * config.input_len / duration if duration else 0.0,
            "output_tokens_per_s": output_tokens / duration if duration else 0.0,
            "total_output_tokens": output_tokens, "ttft_ms": percentiles([r.ttft for r in done]),
            "tpot_ms": percentiles(tpot), "itl_ms": percentiles([g for r in done for g in r.chunk_gaps]),
            "e2e_latency_ms": percentiles([r.latency for r in done])}
