"""Run vLLM's offline LLM on a benchmark workload (stdin JSON) and print a JSON result; standalone."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def main() -> None:
    request = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 2) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    workload = request["workload"]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in workload["prompts"]]
    started = time.perf_counter()
    llm = LLM(model=request["model"], dtype="float32", max_model_len=2048, seed=0)
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=workload["output_len"], ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    seconds, runs = [], []
    for _ in range(max(1, workload.get("runs", 1))):  # the median run counts, as for every engine
        llm.reset_prefix_cache()  # each run computes every prompt (the warm-up and earlier runs cached them)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
        runs.append([list(o.outputs[0].token_ids) for o in outputs])
    tokens, elapsed = runs[0], statistics.median(seconds)
    generated = sum(len(t) for t in tokens)
    result = {"load_s": load_s, "elapsed_s": elapsed, "output_tokens": generated,
              "output_tok_s": generated / elapsed, "runs_output_tok_s": [generated / s for s in seconds],
              "outputs": tokens, "runs_identical": all(r == tokens for r in runs)}
    if len(prompts) == 1:
        samples = []
        for probe in workload["ttft_prompts"]:
            started = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=probe)], SamplingParams(temperature=0.0, max_tokens=1),
                         use_tqdm=False)
            samples.append(time.perf_counter() - started)
        result.update(ttft_s=statistics.median(samples), ttft_samples_s=samples)
        result["decode_tok_s"] = (generated - 1) / max(elapsed - result["ttft_s"], 1e-9)
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
