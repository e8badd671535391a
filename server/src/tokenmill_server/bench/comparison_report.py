"""The serving comparison's report: every server's figures, the ratios tokenmill / vLLM, the
acceptance targets, and a plain-text rendering of it all."""

from __future__ import annotations

import os
from typing import Any

from tokenmill.benchmarks.host import describe
from tokenmill_server.bench.serve_workload import ServeWorkload

ENGINE = "tokenmill"
BASELINE = "vllm"
OUTPUT_TOK_S_TARGET = 1.5
READY_S_TARGET = 20.0
CONTENTION_SHARE = 0.05
# (name in the ratios, how to read it from a server's figures); all ratios are tokenmill / baseline.
RATIO_FIGURES = (
    ("output_tok_s", lambda r: r.get("output_tok_s")),
    ("requests_per_s", lambda r: r.get("requests_per_s")),
    ("total_tok_s", lambda r: r.get("total_tok_s")),
    ("ttft_p50_ms", lambda r: r.get("ttft_ms", {}).get("p50")),
    ("tpot_p50_ms", lambda r: r.get("tpot_ms", {}).get("p50")),
    ("e2el_p50_ms", lambda r: r.get("e2el_ms", {}).get("p50")),
    ("ready_s", lambda r: r.get("ready_s")),
)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median output tok/s (the upper one of an even count), all of its figures together."""
    ordered = sorted(runs, key=lambda run: run["output_tok_s"])
    return ordered[len(ordered) // 2]


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of one run, for the list of all runs beside the median."""
    return {"output_tok_s": run["output_tok_s"], "requests_per_s": run["requests_per_s"],
            "ttft_p50_ms": run.get("ttft_ms", {}).get("p50"), "tpot_p50_ms": run.get("tpot_ms", {}).get("p50"),
            "duration_s": run["duration_s"], "failed": run["failed"], "seed": run.get("seed"),
            "other_cpu_s": run.get("other_cpu_s")}


def ratios(results: dict[str, dict[str, Any]], engine: str = ENGINE, baseline: str = BASELINE) -> dict[str, float]:
    """``engine``'s figures divided by ``baseline``'s, for the figures both measured (empty if either failed)."""
    ours, theirs = results.get(engine, {}), results.get(baseline, {})
    if not ours or not theirs or "error" in ours or "error" in theirs:
        return {}
    found = {}
    for name, read in RATIO_FIGURES:
        a, b = read(ours), read(theirs)
        if a is not None and b:
            found[name] = a / b
    return found


def targets(results: dict[str, dict[str, Any]], found: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The acceptance targets that could be checked in this run, each with its measurement and verdict."""
    checks: dict[str, dict[str, Any]] = {}
    if "output_tok_s" in found:
        checks[f"output tok/s >= {OUTPUT_TOK_S_TARGET}x vLLM's server"] = {
            "measured": found["output_tok_s"], "met": found["output_tok_s"] >= OUTPUT_TOK_S_TARGET}
    ready = results.get(ENGINE, {}).get("ready_s")
    if ready is not None:
        checks[f"tokenmill serve ready within {READY_S_TARGET:.0f} s"] = {"measured": ready, "met": ready <= READY_S_TARGET}
    return checks


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def contention_notes(results: dict[str, dict[str, Any]], cpus: int, threshold: float = CONTENTION_SHARE) -> list[str]:
    """A note for every run during which other processes used over ``threshold`` of the machine's CPU time."""
    notes = []
    for engine, result in results.items():
        runs = result.get("runs") or ([result] if "output_tok_s" in result else [])
        for number, run in enumerate(runs, start=1):
            other, duration = run.get("other_cpu_s"), run.get("duration_s")
            if other is not None and duration and other / (duration * cpus) > threshold:
                notes.append(f"{engine} run {number}: other processes used {other:.1f} CPU-s in its {duration:.1f} s "
                             f"({other / (duration * cpus):.0%} of {cpus} CPUs), so its figures are slowed by them")
    return notes


def build_report(workload: ServeWorkload, results: dict[str, dict[str, Any]], client: str,
                 notes: list[str] | None = None) -> dict[str, Any]:
    """The whole JSON report; ratios and targets only where both sides were measured by the same client."""
    found = ratios(results)
    report: dict[str, Any] = {"workload": workload.describe(), "client": client, "servers": results}
    if found:
        report["ratios"] = {f"{ENGINE}/{BASELINE}": found,
                            "reading": "above 1 is better for throughput, below 1 for latencies and ready_s"}
    report["targets"] = targets(results, found)
    report["notes"] = list(notes or []) + contention_notes(results, _cpus())
    return report


def _server_line(name: str, result: dict[str, Any]) -> str:
    if "error" in result:
        ready = f"ready {result['ready_s']:.1f} s, then " if "ready_s" in result else ""
        return f"  {name:<10} {ready}error: {result['error']}"
    ttft, tpot = result.get("ttft_ms", {}), result.get("tpot_ms", {})
    line = (f"  {name:<10} ready {result['ready_s']:6.1f} s  {result['output_tok_s']:8.1f} output tok/s  "
            f"{result['requests_per_s']:6.2f} req/s  TTFT p50 {ttft.get('p50', 0):8.1f} ms  "
            f"TPOT p50 {tpot.get('p50', 0):7.1f} ms  {result['completed']}/{result['completed'] + result['failed']} ok")
    if "runs" in result:
        line += f"  (median of {len(result['runs'])} runs: " + ", ".join(f"{r['output_tok_s']:.1f}" for r in result["runs"]) + ")"
    return line


def render(report: dict[str, Any]) -> str:
    """The report as a few lines of text for the terminal."""
    w = report["workload"]
    lines = [f"serving: {w['num_prompts']} requests x {w['input_len']} in / {w['output_len']} out, "
             f"concurrency {w['max_concurrency'] or 'unlimited'}, rate {w['request_rate']}; client: {report['client']}"]
    if "host" in report:
        lines.append(describe(report["host"]))
    lines += [_server_line(name, result) for name, result in report["servers"].items()]
    for pair, found in report.get("ratios", {}).items():
        if isinstance(found, dict):
            lines.append(f"  {pair}: " + ", ".join(f"{k} x{v:.2f}" for k, v in found.items()))
    for name, check in report["targets"].items():
        lines.append(f"  target {name}: {check['measured']:.2f} -> {'met' if check['met'] else 'NOT met'}")
    lines += [f"  note: {note}" for note in report["notes"]]
    return "\n".join(lines)
