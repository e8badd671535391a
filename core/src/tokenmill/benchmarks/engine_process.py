"""Run one engine on one workload in this process and print a JSON result (used as a subprocess).

Input on stdin: {"engine": "tokenmill" | "hf", "model": path, "workload": {...}, "options": {...}}.
Each engine runs alone in its own process so memory, threads and warm caches never mix, and times
the workload ``workload["runs"]`` times (prefix caches emptied before each run): the figures are the
median run's (``timed_runs``), since a small shared machine swings by a third from minute to minute.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def _hf_model(model: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    dtype_ = getattr(torch, dtype)
    if model.endswith(".gguf"):
        import os

        return AutoModelForCausalLM.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model),
                                                    dtype=dtype_).eval()
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype_).eval()


def run_hf(model: str, workload: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """HF transformers: one batched greedy ``generate`` over all prompts (left padding)."""
    import torch

    torch.set_num_threads(options.get("threads") or torch.get_num_threads())
    started = time.perf_counter()
    hf = _hf_model(model, options.get("dtype", "float32"))
    load_s = time.perf_counter() - started
    prompts, output_len = workload["prompts"], workload["output_len"]
    width = max(len(p) for p in prompts)
    pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        hf.generate(input_ids[:1, -8:], attention_mask=mask[:1, -8:], max_new_tokens=2, do_sample=False)
        result = timed_runs(lambda: hf.generate(input_ids, attention_mask=mask, max_new_tokens=output_len,
                                                min_new_tokens=output_len, do_sample=False, eos_token_id=None,
                                                pad_token_id=pad)[:, width:].tolist(), workload.get("runs", 1))
        elapsed = result["elapsed_s"]
        result["load_s"] = load_s
        if len(prompts) == 1:
            def first_token(probe_ids: list[int]) -> None:
                probe = torch.tensor([probe_ids])
                hf.generate(probe, attention_mask=torch.ones_like(probe), max_new_tokens=1, do_sample=False,
                            pad_token_id=pad)

            result.update(_time_first_tokens(first_token, workload["ttft_prompts"]))
            result["decode_tok_s"] = (output_len - 1) / max(elapsed - result["ttft_s"], 1e-9)
    return result


def run_tokenmill(model: str, workload: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """tokenmill's offline LLM API on the same token ids, greedy, exactly ``output_len`` tokens each."""
    from tokenmill import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model, **options.get("engine_args", {}))
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=workload["output_len"], ignore_eos=True)
    llm.generate([{"prompt_token_ids": workload["prompts"][0][:8]}], params.clone(max_tokens=2), use_tqdm=False)
    first_run: list[Any] = []

    def run_once() -> list[list[int]]:
        llm.reset_prefix_cache()  # each run computes every prompt (earlier runs cached them)
        outputs = llm.generate([{"prompt_token_ids": p} for p in workload["prompts"]], params, use_tqdm=False)
        if not first_run:
            first_run.extend(outputs)
        return [o.outputs[0].token_ids for o in outputs]

    result = timed_runs(run_once, workload.get("runs", 1))
    outputs, elapsed, generated = first_run, result["elapsed_s"], result["output_tokens"]
    result.update(load_s=load_s, linear_kernels=_linear_kernels(llm.engine.core.runner.model))
    stats = llm.engine.core.scheduler.stats()
    if stats.spec_num_draft_tokens:  # speculative decoding: totals of the warm-up and the runs
        draft = getattr(llm.engine.core.runner.proposer, "model", None)
        result["speculative"] = {"drafts": stats.spec_num_drafts, "draft_tokens": stats.spec_num_draft_tokens,
                                 "accepted_tokens": stats.spec_num_accepted_tokens,
                                 "acceptance_rate": stats.spec_acceptance_rate,
                                 "draft_linear_kernels": _linear_kernels(draft) if draft is not None else []}
    if len(outputs) == 1:
        if outputs[0].metrics is not None:  # the run's own first token (first prefill of this length)
            metrics = outputs[0].metrics
            result["ttft_in_run_s"] = metrics.first_token_time - metrics.arrival_time
        result.update(_time_first_tokens(
            lambda probe: llm.generate([{"prompt_token_ids": probe}], params.clone(max_tokens=1), use_tqdm=False),
            workload["ttft_prompts"]))
        result["decode_tok_s"] = (generated - 1) / max(elapsed - result["ttft_s"], 1e-9)
    return result


def timed_runs(run: Callable[[], list[list[int]]], count: int) -> dict[str, Any]:
    """Time ``run`` (greedy outputs: token ids per prompt) ``count`` times: the median run's seconds and
    throughput, every run's throughput, the first run's outputs and whether every run gave the same."""
    seconds, outputs = [], []
    for _ in range(max(1, count)):
        started = time.perf_counter()
        outputs.append(run())
        seconds.append(time.perf_counter() - started)
    generated = sum(len(tokens) for tokens in outputs[0])
    elapsed = statistics.median(seconds)
    return {"elapsed_s": elapsed, "output_tokens": generated, "output_tok_s": generated / elapsed,
            "runs_output_tok_s": [generated / s for s in seconds], "outputs": outputs[0],
            "runs_identical": all(o == outputs[0] for o in outputs)}


def _time_first_tokens(first_token: Callable[[list[int]], Any], probes: list[list[int]]) -> dict[str, Any]:
    """``ttft_s`` (the median) and ``ttft_samples_s``: the seconds ``first_token`` took on each probe."""
    samples = []
    for probe in probes:
        started = time.perf_counter()
        first_token(probe)
        samples.append(time.perf_counter() - started)
    return {"ttft_s": statistics.median(samples), "ttft_samples_s": samples}


def _linear_kernels(model: Any) -> list[str]:
    """The kernels the model's linear layers run (e.g. ``onednn-linear``, ``gguf-packed-cpu``)."""
    return sorted({kernel.name for module in model.modules() if (kernel := getattr(module, "kernel", None)) is not None
                   and hasattr(kernel, "name")})


ENGINES = {"hf": run_hf, "tokenmill": run_tokenmill}


def main() -> None:
    request = json.load(sys.stdin)
    result = ENGINES[request["engine"]](request["model"], request["workload"], request.get("options", {}))
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
