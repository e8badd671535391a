"""ci/gpu_check.sh and ci/gpu_check.py, on the CPU: the shell script parses, the driver plans the
GPU steps it should, records failing and hanging steps without stopping, and its --dry-run (tiny
parity and throughput with eager decode graphs) passes and writes its JSON summary."""

import json
import subprocess
import sys
import time

from ci import gpu_check
from ci.module_map import ROOT


def test_the_shell_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(ROOT / "ci" / "gpu_check.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_pins_follow_installed_versions():
    from importlib.metadata import version

    assert gpu_check.pins(["pytest", "no-such-distribution-tm"]) == [f"pytest=={version('pytest')}",
                                                                     "no-such-distribution-tm"]


def test_make_gpu_wheels_downloads_cp312_wheels_into_the_ignored_folder():
    result = subprocess.run(["make", "-n", "gpu-wheels"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--python-version 3.12" in result.stdout and "-d .gpu-wheels" in result.stdout
    for name in ("stevedore", "msgspec", "pyzmq", "gguf", "pbr", "setuptools"):
        assert name in result.stdout
    assert ".gpu-wheels/" in (ROOT / ".gitignore").read_text().splitlines()


def plan(*argv: str, only: list[str] | None = None) -> dict[str, gpu_check.Step]:
    parser_args = gpu_check.argparse.Namespace(dry_run="--dry-run" in argv, work="/tmp/w",
                                               device="cpu" if "--dry-run" in argv else "cuda", only=only)
    return {step.name: step for step in gpu_check.plan_steps(parser_args)}


def marker(argv: list[str]) -> str:
    """The ``-m`` expression given to pytest (after ``python -m pytest``)."""
    return argv[argv.index("pytest") + 1:][argv[argv.index("pytest") + 1:].index("-m") + 1]


def test_the_gpu_plan_runs_the_gpu_lane_compiled_triton_parity_and_throughput():
    steps = plan()
    assert list(steps) == ["prepare", "gpu-lane", "triton-compiled", "parity:off", "parity:on",
                           "throughput:float16", "throughput:bfloat16"]
    lane = steps["gpu-lane"].argv
    assert marker(lane) == "gpu" and "attention_backends/triton" in lane
    assert "quantization/gguf/tests" in lane and "core/tests/test_runner_graph_triton.py" in lane
    compiled = steps["triton-compiled"]
    assert marker(compiled.argv) == "not gpu" and compiled.env == {"TRITON_INTERPRET": ""}
    assert sum(step.timeout for step in steps.values()) <= 450  # with ~1 minute of setup: within 8.5 minutes
    assert steps["parity:on"].argv[-2:] == ["--graphs", "on"]
    assert steps["throughput:float16"].argv[-2:] == ["--dtype", "float16"]


def test_only_keeps_prepare_and_the_named_steps():
    assert list(plan(only=["gpu-lane", "parity"])) == ["prepare", "gpu-lane", "parity:off", "parity:on"]
    assert list(plan(only=["parity:on"])) == ["prepare", "parity:on"]


def test_the_dry_run_plan_skips_pytest_and_runs_on_the_cpu():
    steps = plan("--dry-run")
    assert list(steps) == ["prepare", "parity:off", "parity:on", "throughput:float32", "throughput:bfloat16"]
    assert all("--dry-run" in step.argv and "cpu" in step.argv for step in steps.values())


def test_failing_and_hanging_steps_are_recorded(tmp_path):
    with open(tmp_path / "log", "w") as log:
        failed = gpu_check.run_step(gpu_check.Step("boom", [sys.executable, "-c", "print('3 passed, 1 failed');"
                                                                              "raise SystemExit(2)"], 30), log)
        started = time.perf_counter()
        hung = gpu_check.run_step(gpu_check.Step("hang", [sys.executable, "-c", "import time; time.sleep(60)"], 1), log)
        assert time.perf_counter() - started < 20
    assert failed["status"] == "failed (exit 2)" and failed["pytest"] == "3 passed, 1 failed"
    assert hung["status"] == "timed out after 1 s"
    assert "===== hang: timed out" in (tmp_path / "log").read_text()
    table = gpu_check.render({"steps": {"boom": failed, "hang": hung}})
    assert "boom" in table and "failed (exit 2)" in table and "3 passed, 1 failed" in table


def test_dry_run_passes_and_writes_the_summary(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "ci" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["ok"] and summary["dry_run"]
    off, on = summary["steps"]["parity:off"], summary["steps"]["parity:on"]
    assert off["graphs_off"]["identical"] == on["graphs_on"]["identical"] == off["prompts"]
    assert on["graphs_on"]["graphs"] == "eager"
    runs = [run for name, step in summary["steps"].items() if name.startswith("throughput") for run in step["runs"]]
    assert {(run["dtype"], run["graphs"]) for run in runs} == {(d, g) for d in ("float32", "bfloat16")
                                                                for g in ("off", "eager")}
    assert all(run["output_tokens"] == 4 * 8 and run["output_tok_s"] > 0 for run in runs)
    assert "tok/s" in result.stdout and (tmp_path / "gpu_check_steps.log").exists()
