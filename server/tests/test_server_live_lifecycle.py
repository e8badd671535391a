"""Startup, SIGTERM drain, engine death and the engine process's ties to the server (reference
section 6 I.69-71), each on its own tiny-model server (started together to save time)."""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from server_live import LiveServer, sse_events

LONG = {"prompt": "Hello", "max_tokens": 400, "ignore_eos": True}
# One sequence at a time on the drain servers: requests queued behind the first keep the drain going for
# several full-length generations, however fast the engine (the tiny model decodes 400 tokens in well under a
# second on a fast host, which a fixed sleep after the signal could outlast).
ONE_AT_A_TIME = ("--max-num-seqs", "1")
SERVERS = {"drain": ("--shutdown-timeout", "90", *ONE_AT_A_TIME), "double": ("--shutdown-timeout", "60", *ONE_AT_A_TIME),
           "abort": (),
           "keepalive": ("--keep-alive-on-engine-death",), "death": (), "orphan": ()}


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("lifecycle")
    started = {name: LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", *extra, log=logs / f"{name}.log")
               for name, extra in SERVERS.items()}
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop(timeout=5)


def metric_sum(server, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    text = httpx.get(server.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"tokenmill:{name}{{"))


def running(server) -> float:
    return metric_sum(server, "num_requests_running")


def admitted(server) -> float:
    """Requests the engine has taken in so far: running, waiting or finished."""
    return sum(metric_sum(server, name) for name in ("num_requests_running", "num_requests_waiting",
                                                      "request_success_total"))


def wait_running(server, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while running(server) < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests ever ran"
        time.sleep(0.02)


def queue_behind(server, count: int) -> tuple[list[threading.Thread], list[int]]:
    """``count`` full-length non-streaming requests behind the running one, started and taken in by the
    engine; returns their threads and the list their status codes go into."""
    statuses = []
    before = admitted(server)

    def post():
        try:
            statuses.append(httpx.post(server.url + "/v1/completions", json=LONG, timeout=120).status_code)
        except httpx.HTTPError:  # expected only where the test forces an exit
            pass

    threads = [threading.Thread(target=post) for _ in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while admitted(server) < before + count:
        assert time.monotonic() < deadline, f"the engine never took in {count} more requests"
        time.sleep(0.01)
    return threads, statuses


def wait_draining(server, timeout: float = 10.0) -> None:
    """Return once /health answers 503 (the signal has landed and the drain has begun)."""
    deadline = time.monotonic() + timeout
    while (status := httpx.get(server.url + "/health", timeout=5).status_code) != 503:
        assert status == 200 and time.monotonic() < deadline, f"/health still {status}"
        time.sleep(0.01)


def open_stream(server, body):
    """Start a streaming completion in a thread; returns (thread, result dict with 'events')."""
    result = {}

    def run():
        try:
            with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                result["status"] = r.status_code
                result["events"] = sse_events(r)
        except httpx.HTTPError as error:  # expected only where the test forces an exit
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    wait_running(server, 1)
    return thread, result


def wait_exit(server, timeout):
    try:
        return server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def test_port_opens_only_once_the_model_is_loaded(tiny_model, tmp_path):
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", log=tmp_path / "startup.log")
    try:
        first = None
        deadline = time.monotonic() + 240
        while first is None and time.monotonic() < deadline:
            assert server.process.poll() is None, server.log_tail()
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            first = httpx.get(server.url + "/health", timeout=5).status_code
        assert first == 200  # the first answer on the port is already "ready"
        assert "ready on http://127.0.0.1" in server.log_tail(20000)
        assert "KV cache:" in server.log_tail(20000)  # the startup selection report was printed
    finally:
        assert server.stop() == 0


def test_sigterm_drains_running_requests_then_exits_0(servers):
    server = servers["drain"]
    # three more full-length requests queued behind it keep the drain going while the test looks at it
    thread, result = open_stream(server, {**LONG, "max_tokens": 400})
    queued, statuses = queue_behind(server, 3)
    server.process.send_signal(signal.SIGTERM)
    wait_draining(server)
    refused = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
    assert refused.status_code == 503 and "Retry-After" in refused.headers
    thread.join(90)
    for waiting in queued:
        waiting.join(90)
    assert statuses == [200, 200, 200]  # the waiting requests were served too
    assert "error" not in result, server.log_tail()
    chunks = [json.loads(d) for _, d in result["events"] if d != "[DONE]"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # finished, not cut off
    assert wait_exit(server, 30) == 0


def test_second_signal_exits_at_once(servers):
    server = servers["double"]
    thread, _ = open_stream(server, {**LONG, "max_tokens": 500})
    queued, _ = queue_behind(server, 3)
    server.process.send_signal(signal.SIGTERM)
    wait_draining(server)
    assert server.process.poll() is None  # draining: up to 60 s
    server.process.send_signal(signal.SIGTERM)
    assert wait_exit(server, 15) is not None
    for waiting in [thread, *queued]:
        waiting.join(30)


def test_sigterm_with_zero_timeout_aborts_with_errors(servers):
    server = servers["abort"]
    thread, result = open_stream(server, {**LONG, "max_tokens": 500})
    blocked = {}

    def nonstreaming():
        blocked["response"] = httpx.post(server.url + "/v1/completions", json=LONG, timeout=60)

    other = threading.Thread(target=nonstreaming)
    other.start()
    wait_running(server, 2)
    server.process.send_signal(signal.SIGTERM)
    thread.join(30)
    other.join(30)
    datas = [d for _, d in result["events"]]
    assert datas[-1] == "[DONE]" and "error" in json.loads(datas[-2])
    assert blocked["response"].status_code == 503
    assert wait_exit(server, 30) == 0


def engine_process(server) -> psutil.Process:
    children = psutil.Process(server.process.pid).children(recursive=True)
    engine = [c for c in children if "tokenmill.engine_core.core_process" in " ".join(c.cmdline())]
    assert len(engine) == 1
    return engine[0]


def test_engine_death_fails_requests_and_health_but_keeps_serving_503s(servers):
    server = servers["keepalive"]
    engine = engine_process(server)
    address = next(arg for arg in engine.cmdline() if arg.startswith("ipc://"))
    socket_dir = os.path.dirname(address[len("ipc://"):])
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700
    assert "--requests" in engine.cmdline() and "pickle" not in " ".join(engine.cmdline())
    thread, result = open_stream(server, {**LONG, "max_tokens": 500})
    engine.kill()
    thread.join(30)
    assert not thread.is_alive()
    datas = [d for _, d in result["events"]]
    assert datas[-1] == "[DONE]" and json.loads(datas[-2])["error"]["code"] == "engine_dead"
    assert httpx.get(server.url + "/health", timeout=5).status_code == 503
    later = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
    assert later.status_code == 503
    assert server.stop() == 0
    assert not os.path.exists(socket_dir)


def test_engine_death_makes_the_server_exit_1(servers):
    server = servers["death"]
    engine_process(server).kill()
    assert wait_exit(server, 30) == 1


def test_engine_dies_with_the_server(servers):
    server = servers["orphan"]
    engine = engine_process(server)
    address = next(arg for arg in engine.cmdline() if arg.startswith("ipc://"))
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)
    engine.wait(10)  # the parent-death signal (and the watchdog) end it
    assert not engine.is_running()
    shutil.rmtree(os.path.dirname(address[len("ipc://"):]), ignore_errors=True)  # a killed server cannot clean up


def test_bad_model_path_fails_cleanly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tokenmill.cli.main", "serve", str(tmp_path / "missing"),
                             "--port", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "failed to start" in result.stderr
