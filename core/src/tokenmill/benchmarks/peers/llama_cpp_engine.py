"""Run llama.cpp (llama-cpp-python) greedily on a benchmark workload (stdin JSON); standalone.

Prompts run one after another through the high-level API (no multi-sequence batching), so W1 here
measures llama.cpp's sequential throughput; the result says so.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def main() -> None:
    request = json.load(sys.stdin)
    from llama_cpp import Llama

    workload = request["workload"]
    started = time.perf_counter()
    llm = Llama(model_path=request["model"], n_ctx=2048, n_threads=os.cpu_count() or 2, verbose=False, seed=0)
    load_s = time.perf_counter() - started

    def generate(prompt: list[int], count: int) -> list[int]:
        llm.reset()
        tokens = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            tokens.append(token)
            if len(tokens) == count:
                break
        return tokens

    generate(workload["prompts"][0][:8], 2)
    seconds, runs = [], []
    for _ in range(max(1, workload.get("runs", 1))):  # the median run counts, as for every engine
        started = time.perf_counter()
        runs.append([generate(p, workload["output_len"]) for p in workload["prompts"]])
        seconds.append(time.perf_counter() - started)
    outputs, elapsed = runs[0], statistics.median(seconds)
    generated = sum(len(t) for t in outputs)
    result = {"load_s": load_s, "elapsed_s": elapsed, "output_tokens": generated, "output_tok_s": generated / elapsed,
              "runs_output_tok_s": [generated / s for s in seconds], "outputs": outputs,
              "runs_identical": all(r == outputs for r in runs), "note": "sequential prompts (high-level API), Q4_1 weights"}
    if len(outputs) == 1:
        samples = []
        for probe in workload["ttft_prompts"]:
            started = time.perf_counter()
            generate(probe, 1)
            samples.append(time.perf_counter() - started)
        result.update(ttft_s=statistics.median(samples), ttft_samples_s=samples)
        result["decode_tok_s"] = (generated - 1) / max(elapsed - result["ttft_s"], 1e-9)
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
