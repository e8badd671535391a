"""ServeComparison: ``tokenmill bench serve --peers`` — start each server in turn (tokenmill, then
vLLM's from the peer venv) on a free local port in its own process group, time it until it answers,
load it with the same client (vLLM's ``vllm bench serve``; tokenmill's own when the venv lacks vLLM),
end its whole group, and report every figure side by side. A server that cannot run is recorded with
its exact error; the others are still measured."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from tokenmill.benchmarks.peer_venv import PeerVenv
from tokenmill_server.bench.comparison_report import build_report, median_run, run_summary
from tokenmill_server.bench.other_cpu import OtherCpu
from tokenmill_server.bench.process_group import ProcessGroup
from tokenmill_server.bench.serve_workload import ServeWorkload
from tokenmill_server.bench.vllm_bench_client import LOG_NOISE, client_env, run_client

ENGINES = ("tokenmill", "vllm")
VLLM_CLIENT = "vllm bench serve"
OWN_CLIENT = "tokenmill bench serve"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(group: ProcessGroup, base_url: str, timeout: float, name: str) -> tuple[float, str]:
    """Seconds from spawn until GET /health answers 200 and GET /v1/models lists a model, and that
    model's id. RuntimeError (with the log's last lines) if the server exits or ``timeout`` passes."""
    deadline = group.started + timeout
    with httpx.Client(base_url=base_url, timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            code = group.returncode()
            if code is not None:
                raise RuntimeError(f"{name} exited with code {code} before it was ready: "
                                   f"{group.log_tail(ignore=LOG_NOISE)}")
            try:
                if client.get("/health").status_code == 200:
                    models = client.get("/v1/models")
                    if models.status_code == 200 and models.json().get("data"):
                        return group.elapsed(), models.json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{name} was not ready within {timeout:.0f} s: {group.log_tail(ignore=LOG_NOISE)}")


def _cpu_list() -> str:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}"
    return ",".join(map(str, cpus))


def vllm_server_env() -> dict[str, str]:
    """vLLM-CPU's settings for a fair run here (every core bound, 4 GiB of KV cache), unless set already."""
    env = client_env()
    for key, value in (("VLLM_CPU_OMP_THREADS_BIND", _cpu_list()), ("VLLM_CPU_KVCACHE_SPACE", "4")):
        env[key] = os.environ.get(key, value)
    return env


def own_client_figures(report: dict[str, Any]) -> dict[str, Any]:
    """tokenmill's load-client report (``run_load``) under the names ``vllm bench serve``'s figures use."""
    figures = {"completed": report["completed"], "failed": report["failed"], "duration_s": report["duration_s"],
               "requests_per_s": report["requests_per_s"], "output_tok_s": report["output_tokens_per_s"],
               "total_tok_s": report["input_tokens_per_s"] + report["output_tokens_per_s"],
               "total_output_tokens": report["total_output_tokens"], "errors": report["errors"]}
    for ours, theirs in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms"),
                         ("e2e_latency_ms", "e2el_ms")):
        figures[theirs] = dict(report[ours])
    return figures


class ServeComparison:
    """The comparison of ``engines`` on ``workload``, loading each started server ``runs`` times and keeping
    the median run; ``run()`` returns the report (see comparison_report)."""

    def __init__(self, model: str, workload: ServeWorkload, peers: PeerVenv, work_dir: str | Path,
                 ready_timeout: float = 600.0, client_timeout: float = 1800.0,
                 extra_args: dict[str, list[str]] | None = None, engines: tuple[str, ...] = ENGINES, runs: int = 1):
        self.model = model
        self.workload = workload
        self.peers = peers
        self.work_dir = Path(work_dir)
        self.ready_timeout = ready_timeout
        self.client_timeout = client_timeout
        self.extra_args = extra_args or {}
        self.engines = engines
        self.runs = max(1, runs)

    def run(self) -> dict[str, Any]:
        """Each engine in turn, one server at a time; never raises for a server that fails."""
        notes: list[str] = []
        vllm_missing = self.peers.missing("vllm")
        tokenizer, tokenizer_error = (None, vllm_missing) if vllm_missing else self._peer_model()
        client = VLLM_CLIENT if tokenizer else OWN_CLIENT
        if client == OWN_CLIENT:
            notes.append(f"vLLM's client could not run ({tokenizer_error}), so tokenmill's own load client "
                         f"measured: its figures are not comparable with runs of {VLLM_CLIENT}")
        else:
            version = self.peers.version("vllm-cpu") or self.peers.version("vllm")
            notes.append(f"vLLM {version} (server and client) from {self.peers.path}")
        results: dict[str, dict[str, Any]] = {}
        for engine in self.engines:
            if engine == "vllm" and tokenizer is None:
                results[engine] = {"error": tokenizer_error}
                continue
            results[engine] = self._measure(engine, client, tokenizer)
        return build_report(self.workload, results, client, notes)

    def _peer_model(self) -> tuple[str | None, str | None]:
        """The HF folder vLLM's server loads and its client tokenizes with (a GGUF is exported once to fp32)."""
        if not self.model.endswith(".gguf"):
            return self.model, None
        from tokenmill.benchmarks.hf_export import export_hf_dir

        try:
            return export_hf_dir(self.model), None
        except Exception as error:  # the peer gets the exact reason; tokenmill is still measured
            return None, f"exporting {self.model} to an fp32 HF folder failed: {type(error).__name__}: {error}"

    def _server(self, engine: str, port: int, peer_model: str | None) -> tuple[list[str], dict[str, str]]:
        local = ["--host", "127.0.0.1", "--port", str(port)]
        extra = list(self.extra_args.get(engine, []))
        if engine == "tokenmill":
            return [sys.executable, "-m", "tokenmill.cli.main", "serve", self.model, "--dtype", "float32",
                    *local, *extra], {}
        if engine == "vllm":
            command = self.peers.script_command("vllm_cli.py", "serve", str(peer_model), "--dtype", "float32",
                                                "--seed", "0", *local, *extra)
            return command, vllm_server_env()
        raise ValueError(f"unknown engine {engine!r}: choose from {', '.join(ENGINES)}")

    def _measure(self, engine: str, client: str, peer_model: str | None) -> dict[str, Any]:
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        command, env = self._server(engine, port, peer_model)
        work = self.work_dir / engine
        entry: dict[str, Any] = {"client": client, "command": command, "server_log": str(work / "server.log")}
        group = None
        try:
            entry["load_average_before"] = os.getloadavg()[0]  # other work on the machine skews every figure
            group = ProcessGroup(command, work / "server.log", env=env)
            ready_s, model = wait_until_serving(group, base_url, self.ready_timeout, f"{engine} server")
            entry.update(ready_s=ready_s, model=model)
            # run i uses seed + i, so no run reuses an earlier run's prompts from the server's prefix cache;
            # every server gets the same sequence of prompt sets
            runs = []
            for i in range(self.runs):
                other = OtherCpu()
                run = self._load(client, base_url, model, peer_model, work / f"run-{i + 1}",
                                 replace(self.workload, seed=self.workload.seed + i))
                runs.append({**run, "other_cpu_s": other.seconds(group.groups())})
            entry.update({**median_run(runs), "ready_s": ready_s, "model": model})
            if len(runs) > 1:
                entry["runs"] = [run_summary(run) for run in runs]
        except Exception as error:  # recorded exactly; the comparison goes on with the next server
            entry["error"] = str(error) if isinstance(error, RuntimeError) else f"{type(error).__name__}: {error}"
        finally:
            if group is not None:
                group.stop()
                if group.alive():
                    entry["cleanup_error"] = f"process groups {sorted(group.groups())} still have processes after SIGKILL"
        return entry

    def _load(self, client: str, base_url: str, model: str, peer_model: str | None, work: Path,
              workload: ServeWorkload) -> dict[str, Any]:
        if client == VLLM_CLIENT:
            figures = run_client(self.peers, base_url, model, str(peer_model), workload, work, self.client_timeout)
        else:
            figures = own_client_figures(self._own_load(base_url, model, workload))
        return {**figures, "seed": workload.seed}

    def _own_load(self, base_url: str, model: str, w: ServeWorkload) -> dict[str, Any]:
        from tokenmill_server.bench.serve_load import LoadConfig, run_load

        config = LoadConfig(base_url=base_url, model=model, num_prompts=w.num_prompts, input_len=w.input_len,
                            output_len=w.output_len, max_concurrency=w.max_concurrency, request_rate=w.request_rate,
                            seed=w.seed, timeout=self.client_timeout)
        return asyncio.run(run_load(config))
