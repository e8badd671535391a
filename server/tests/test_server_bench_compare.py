"""``tokenmill bench serve --peers``: vLLM's client command line, its result JSON, the report and its
ratios, errors recorded for servers that cannot run, and process groups that end whole. No vLLM needed."""

import json
import os
import sys
import time

import pytest

from tokenmill.benchmarks.peer_venv import PEERS_DIR, PeerVenv
from tokenmill_server.bench import bench_command, serve_comparison
from tokenmill_server.bench.comparison_report import build_report, contention_notes, median_run, ratios, render
from tokenmill_server.bench.other_cpu import OtherCpu
from tokenmill_server.bench.proc_table import descendant_groups, read_proc_table
from tokenmill_server.bench.process_group import ProcessGroup, exit_on_sigterm
from tokenmill_server.bench.serve_comparison import ServeComparison, own_client_figures, vllm_server_env
from tokenmill_server.bench.serve_workload import ServeWorkload
from tokenmill_server.bench.vllm_bench_client import client_command, parse_result

# A `vllm bench serve` (0.32) result saved with --save-detailed, per-request lists cut to 3 entries.
VLLM_RESULT = {
    "date": "20261130-210232", "endpoint_type": "openai", "backend": "openai", "label": None,
    "model_id": "SmolLM2-135M-Instruct.Q4_1.gguf", "tokenizer_id": ".cache/bench/SmolLM2-fp32", "num_prompts": 64,
    "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 64, "duration": 26.883293811999465,
    "completed": 62, "failed": 2, "total_input_tokens": 7936, "total_output_tokens": 7936,
    "request_throughput": 2.3062, "request_goodput": None, "output_throughput": 295.2,
    "total_token_throughput": 590.4, "input_lens": [128, 128, 128], "output_lens": [128, 0, 128],
    "ttfts": [3.5, 0.0, 3.6], "itls": [[0.1], [], [0.1]], "latencies": [26.7, 0.0, 26.8],
    "errors": ["", "Traceback (most recent call last):\n  ...\naiohttp.client_exceptions.ServerDisconnectedError", ""],
    "max_output_tokens_per_s": 704.0, "max_concurrent_requests": 64, "rtfx": 0.0,
    "mean_ttft_ms": 3545.78, "median_ttft_ms": 3573.19, "std_ttft_ms": 1520.36, "p50_ttft_ms": 3573.19,
    "p90_ttft_ms": 5551.63, "p99_ttft_ms": 5552.04, "mean_tpot_ms": 182.99, "median_tpot_ms": 182.89,
    "std_tpot_ms": 11.35, "p50_tpot_ms": 182.89, "p90_tpot_ms": 197.59, "p99_tpot_ms": 201.50,
    "mean_itl_ms": 182.99, "median_itl_ms": 105.96, "std_itl_ms": 378.90, "p50_itl_ms": 105.96,
    "p90_itl_ms": 118.78, "p99_itl_ms": 2427.29, "mean_e2el_ms": 26785.56, "median_e2el_ms": 26797.50,
    "std_e2el_ms": 79.69, "p50_e2el_ms": 26797.50, "p90_e2el_ms": 26876.85, "p99_e2el_ms": 26877.30,
}


def _value(command, flag):
    return command[command.index(flag) + 1]


def test_client_command_is_vllm_bench_serve_under_the_peer_python(tmp_path):
    peers = PeerVenv(str(tmp_path / "venv"))
    command = client_command(peers, "http://127.0.0.1:9", "m", "/tok", ServeWorkload(), str(tmp_path))
    assert command[:2] == [peers.python, os.path.join(PEERS_DIR, "vllm_cli.py")]
    assert command[2:4] == ["bench", "serve"]
    expected = {"--backend": "openai", "--endpoint": "/v1/completions", "--base-url": "http://127.0.0.1:9",
                "--model": "m", "--tokenizer": "/tok", "--dataset-name": "random", "--random-input-len": "128",
                "--random-output-len": "128", "--num-prompts": "64", "--max-concurrency": "64",
                "--request-rate": "inf", "--temperature": "0", "--result-dir": str(tmp_path)}
    assert {flag: _value(command, flag) for flag in expected} == expected
    assert {"--ignore-eos", "--save-result", "--save-detailed"} <= set(command)
    assert os.path.isfile(command[1])


def test_client_command_without_a_concurrency_cap_and_with_a_rate(tmp_path):
    command = client_command(PeerVenv(), "u", "m", "t", ServeWorkload(max_concurrency=None, request_rate=4.0), "d")
    assert "--max-concurrency" not in command and _value(command, "--request-rate") == "4.0"


def test_parse_result_reads_throughputs_percentiles_and_errors():
    figures = parse_result(VLLM_RESULT)
    assert figures["output_tok_s"] == pytest.approx(295.2) and figures["requests_per_s"] == pytest.approx(2.3062)
    assert (figures["completed"], figures["failed"], figures["total_output_tokens"]) == (62, 2, 7936)
    assert figures["ttft_ms"] == {"mean": 3545.78, "p50": 3573.19, "p90": 5551.63, "p99": 5552.04}
    assert figures["e2el_ms"]["p99"] == pytest.approx(26877.30) and figures["peak_output_tok_s"] == 704.0
    assert figures["errors"] == {"aiohttp.client_exceptions.ServerDisconnectedError": 1}
    json.dumps(figures)


def test_parse_result_names_what_is_missing():
    with pytest.raises(ValueError, match="lacks 'output_throughput'"):
        parse_result({k: v for k, v in VLLM_RESULT.items() if k != "output_throughput"})


def _measured(output_tok_s, ready_s, ttft_p50):
    return {"ready_s": ready_s, "output_tok_s": output_tok_s, "requests_per_s": output_tok_s / 128,
            "total_tok_s": output_tok_s * 2, "ttft_ms": {"p50": ttft_p50}, "tpot_ms": {"p50": 100.0},
            "e2el_ms": {"p50": 20000.0}, "completed": 64, "failed": 0, "duration_s": 20.0}


def test_report_has_ratios_and_targets_when_both_servers_ran():
    results = {"tokenmill": _measured(450.0, 18.0, 1000.0), "vllm": _measured(300.0, 120.0, 2000.0)}
    report = build_report(ServeWorkload(), results, "vllm bench serve")
    found = report["ratios"]["tokenmill/vllm"]
    assert found["output_tok_s"] == pytest.approx(1.5) and found["ttft_p50_ms"] == pytest.approx(0.5)
    assert found["ready_s"] == pytest.approx(0.15)
    assert [check["met"] for check in report["targets"].values()] == [True, True]
    assert report["workload"]["request_rate"] == "inf" and report["workload"]["ignore_eos"] is True
    json.dumps(report)
    assert "tokenmill/vllm: output_tok_s x1.50" in render(report)


def test_report_keeps_a_failed_peer_s_error_and_the_other_figures():
    error = "vllm server exited with code 1 before it was ready: ... | RuntimeError: no CPU"
    results = {"tokenmill": _measured(450.0, 25.0, 1000.0), "vllm": {"error": error}}
    report = build_report(ServeWorkload(), results, "vllm bench serve", ["a note"])
    assert "ratios" not in report and ratios(results) == {}
    assert report["servers"]["vllm"]["error"] == error
    assert list(report["targets"].values()) == [{"measured": 25.0, "met": False}]
    text = render(report)
    assert error in text and "450.0 output tok/s" in text and "NOT met" in text and "note: a note" in text


def test_a_missing_peer_venv_is_recorded_without_starting_anything(tmp_path):
    peers = PeerVenv(str(tmp_path / "no-venv"))
    assert peers.missing("vllm") == f"{tmp_path / 'no-venv'} does not exist: run `make bench-peers`"
    report = ServeComparison("model.gguf", ServeWorkload(), peers, tmp_path, engines=("vllm",)).run()
    assert report["servers"] == {"vllm": {"error": peers.missing("vllm")}}
    assert report["client"] == "tokenmill bench serve" and "vLLM's client could not run" in report["notes"][0]


def test_a_module_missing_from_the_peer_venv_is_named(tmp_path):
    (tmp_path / "bin").mkdir()
    os.symlink(sys.executable, tmp_path / "bin" / "python")
    peers = PeerVenv(str(tmp_path))
    assert peers.missing("json") is None
    assert peers.missing("no_such_module_here") == f"no_such_module_here is not installed in {tmp_path}"
    assert peers.version("no-such-distribution") is None
    assert PeerVenv(sys.prefix).version("pytest") == pytest.__version__


def test_a_server_that_dies_before_it_is_ready_is_recorded_with_its_log(tmp_path, monkeypatch):
    comparison = ServeComparison("model.gguf", ServeWorkload(), PeerVenv(str(tmp_path / "none")), tmp_path,
                                 ready_timeout=60, engines=("tokenmill",))
    crash = [sys.executable, "-c", "import sys; print('loading model.gguf: bad magic'); sys.exit(3)"]
    monkeypatch.setattr(comparison, "_server", lambda engine, port, peer_model: (crash, {}))
    report = comparison.run()
    entry = report["servers"]["tokenmill"]
    assert entry["error"] == "tokenmill server exited with code 3 before it was ready: loading model.gguf: bad magic"
    assert "cleanup_error" not in entry and entry["server_log"].endswith("server.log")


def test_each_server_is_loaded_runs_times_and_its_median_run_kept(tmp_path, monkeypatch):
    comparison = ServeComparison("model.gguf", ServeWorkload(), PeerVenv(str(tmp_path / "none")), tmp_path,
                                 engines=("tokenmill",), runs=3)
    groups = []

    class RecordedGroup(ProcessGroup):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            groups.append(self)

    monkeypatch.setattr(serve_comparison, "ProcessGroup", RecordedGroup)
    monkeypatch.setattr(comparison, "_server", lambda engine, port, peer_model: (["sleep", "300"], {}))
    monkeypatch.setattr(serve_comparison, "wait_until_serving", lambda group, url, timeout, name: (2.5, "m"))
    figures = iter([_measured(300.0, 0, 1.0), _measured(450.0, 0, 2.0), _measured(400.0, 0, 3.0)])
    seeds = []

    def load(client, base_url, model, peer_model, work, workload):
        seeds.append(workload.seed)
        return {**next(figures), "duration_s": 20.0}

    monkeypatch.setattr(comparison, "_load", load)
    entry = comparison.run()["servers"]["tokenmill"]
    assert seeds == [0, 1, 2], "each run sends new prompts: none is answered from the prefix cache of the last"
    assert entry["ready_s"] == 2.5 and entry["output_tok_s"] == 400.0 and entry["ttft_ms"] == {"p50": 3.0}
    assert [run["output_tok_s"] for run in entry["runs"]] == [300.0, 450.0, 400.0]
    assert len(groups) == 1 and not groups[0].alive()
    assert median_run([{"output_tok_s": 2.0}, {"output_tok_s": 1.0}]) == {"output_tok_s": 2.0}


def test_stop_ends_processes_left_behind_by_a_leader_that_exited(tmp_path):
    # the leader exits at once, as a crashed server would; its child keeps running in the group
    group = ProcessGroup(["sh", "-c", "sleep 300 & echo started; exit 0"], tmp_path / "log")
    assert group.wait(30) == 0
    assert group.alive(), "the orphaned sleep is still in the group"
    group.stop(grace=5)
    assert not group.alive()
    assert group.log_tail() == "started"


def test_context_manager_ends_a_running_group_with_its_children(tmp_path):
    with ProcessGroup(["sh", "-c", "sleep 300 & sleep 300 & wait"], tmp_path / "log") as group:
        assert group.returncode() is None
    assert not group.alive() and group.returncode() is not None


def test_wait_past_its_timeout_ends_the_group_and_says_so(tmp_path):
    group = ProcessGroup(["sh", "-c", "echo waiting; sleep 300"], tmp_path / "log")
    deadline = time.monotonic() + 30
    while "waiting" not in group.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="did not finish within 0 s: waiting"):
        group.wait(0.2)
    assert not group.alive()


def test_sigterm_unwinds_through_finally_so_groups_are_ended(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    group = ProcessGroup(["sleep", "300"], tmp_path / "log")
    with pytest.raises(SystemExit) as exited, exit_on_sigterm():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            group.stop()
    assert exited.value.code == 128 + signal.SIGTERM and not group.alive()
    assert signal.getsignal(signal.SIGTERM) == before


def test_log_tail_skips_noise(tmp_path):
    (tmp_path / "log").write_text("real error\nnanobind: leaked 4 instances!\n - leaked type x\n")
    group = ProcessGroup(["true"], tmp_path / "other.log")
    group.wait(30)
    group.log_path = tmp_path / "log"
    assert group.log_tail(ignore=("nanobind:", "- leaked")) == "real error"
    group.stop()


def test_own_client_report_maps_onto_the_same_names():
    ours = {"completed": 64, "failed": 0, "errors": {}, "duration_s": 20.0, "requests_per_s": 3.2,
            "output_tokens_per_s": 409.6, "input_tokens_per_s": 409.6, "total_output_tokens": 8192,
            "ttft_ms": {"p50": 1.0}, "tpot_ms": {"p50": 2.0}, "itl_ms": {"p50": 3.0}, "e2e_latency_ms": {"p50": 4.0}}
    figures = own_client_figures(ours)
    assert figures["output_tok_s"] == 409.6 and figures["total_tok_s"] == 819.2 and figures["e2el_ms"] == {"p50": 4.0}


def test_vllm_server_env_binds_every_core_but_keeps_the_user_s_choice(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    env = vllm_server_env()
    cpus = sorted(os.sched_getaffinity(0))
    assert env["VLLM_CPU_OMP_THREADS_BIND"].startswith(str(cpus[0])) and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_peers_refuses_a_base_url_and_unknown_engines(capsys):
    import argparse

    root = argparse.ArgumentParser()
    bench_command.add_parser(root.add_subparsers())
    args = root.parse_args(["bench", "serve", "--peers", "--base-url", "http://127.0.0.1:8000"])
    assert args.func(args) == 2 and "drop --base-url" in capsys.readouterr().err
    args = root.parse_args(["bench", "serve", "--peers", "--engines", "tokenmill,tgi"])
    assert args.func(args) == 2 and "--engines takes" in capsys.readouterr().err


def _fake_proc(root, processes):
    ticks = os.sysconf("SC_CLK_TCK")
    for pid, (ppid, group, seconds) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(ppid), str(group)] + ["0"] * 8 + [str(int(seconds * ticks)), "0"] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} (name with ) paren) " + " ".join(fields) + "\n")


def _machine_busy(root, seconds):
    ticks = os.sysconf("SC_CLK_TCK")
    (root / "stat").write_text(f"cpu  {int(seconds * ticks)} 0 0 999999 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_other_cpu_is_the_machine_s_busy_time_less_the_measured_server_and_the_client(tmp_path):
    _machine_busy(tmp_path, 100.0)
    _fake_proc(tmp_path, {10: (1, 10, 5.0), 11: (10, 11, 1.0), 20: (1, 20, 2.0)})
    assert read_proc_table(tmp_path)[11] == (10, 11, "S", 1.0)
    ours = iter([50.0, 53.0])  # this process and the reaped client: 3 CPU-s during the run
    other = OtherCpu(proc=tmp_path, ours=lambda: next(ours))
    _machine_busy(tmp_path, 120.0)
    _fake_proc(tmp_path, {10: (1, 10, 9.0), 11: (10, 11, 3.0), 20: (1, 20, 2.5), 30: (1, 30, 1.0)})
    # 20 busy - 6 for the server's groups 10 and 11 - 3 for ours: 11, of which other processes still
    # alive show 1.5; the rest went to processes that ended meanwhile
    assert other.seconds({10, 11}) == pytest.approx(11.0)


def test_descendant_groups_follow_children_into_sessions_of_their_own(tmp_path):
    _fake_proc(tmp_path, {10: (1, 10, 0), 11: (10, 11, 0), 12: (11, 11, 0), 13: (10, 10, 0), 20: (1, 20, 0)})
    assert descendant_groups(10, read_proc_table(tmp_path)) == {10, 11}


def test_stop_ends_a_child_that_started_its_own_session(tmp_path):
    # as tokenmill serve's engine core does: outside the leader's group, found through its parent
    script = ("import subprocess, sys, time; child = subprocess.Popen(['sleep', '300'], start_new_session=True); "
              "print(child.pid, flush=True); time.sleep(300)")
    group = ProcessGroup([sys.executable, "-c", script], tmp_path / "log")
    deadline = time.monotonic() + 60
    while not group.log_tail().isdigit() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(group.log_tail())
    assert group.groups() == {group.pid, child}
    group.stop(grace=5)
    assert not group.alive()
    entry = read_proc_table().get(child)
    assert entry is None or entry.state == "Z"


def test_contention_notes_flag_runs_slowed_by_other_work():
    results = {"tokenmill": {**_measured(450.0, 10.0, 1.0), "duration_s": 20.0,
                             "runs": [{"output_tok_s": 450.0, "duration_s": 20.0, "other_cpu_s": 0.5},
                                      {"output_tok_s": 300.0, "duration_s": 20.0, "other_cpu_s": 16.0}]},
               "vllm": {"error": "x"}}
    assert contention_notes(results, cpus=2) == [
        "tokenmill run 2: other processes used 16.0 CPU-s in its 20.0 s (40% of 2 CPUs), so its figures are slowed by them"]


def test_the_load_client_s_prompts_share_no_prefix_and_have_the_asked_length():
    """The client's random prompts: exact token counts, reproducible per seed, and no two alike in
    their first 16-token block (a repeated prompt would measure the prefix cache, not the engine)."""
    import asyncio

    import httpx

    from tokenmill_server.bench.serve_load import LoadConfig, _prompts

    def tokenize(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"tokens": list(range(100, 125)), "count": 25})

    async def prompts(seed: int) -> list[list[int]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(tokenize), base_url="http://load") as client:
            return await _prompts(client, LoadConfig(base_url="http://load", num_prompts=64, input_len=128,
                                                     seed=seed), "m")

    first, again, other = (asyncio.run(prompts(seed)) for seed in (0, 0, 1))
    assert len(first) == 64 and {len(p) for p in first} == {128} and first == again and first != other
    assert len({tuple(p[:16]) for p in first + other}) == 128
