"""Startup failures (issue 28, item 7): each bad model makes ``tokenmill serve`` and ``tokenmill generate``
print one clear error line and exit non-zero, with a traceback only at ``--log-level debug``; a busy port
fails before the model loads; a second SIGINT exits non-zero without a traceback per open stream."""

import json
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import httpx
import pytest
from server_live import LiveServer, free_port


def fabricate(kind: str, tiny_model, root) -> str:
    """A bad model of ``kind`` under ``root`` (most are the tiny model with one thing broken)."""
    path = root / kind
    if kind == "missing":
        return str(path)
    if kind == "text-file":
        path.write_text("not a model\n")
    elif kind == "empty.gguf":
        path.write_bytes(b"")
    elif kind == "garbage.gguf":
        path.write_bytes(bytes(range(256)) * 16)
    elif kind == "truncated.gguf":  # a GGUF header that promises tensors the file does not hold
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 10, 20) + b"\x05\x00")
    else:
        shutil.copytree(tiny_model, path)
        if kind == "broken-config":
            (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": ')
        elif kind == "pickle-only":
            (path / "model.safetensors").unlink()
            (path / "pytorch_model.bin").write_bytes(b"\x80\x04\x95 a pickle")
        elif kind == "lying-header":
            data = (path / "model.safetensors").read_bytes()
            size = struct.unpack("<Q", data[:8])[0]
            header = json.loads(data[8:8 + size])
            name = next(k for k in header if k != "__metadata__")
            header[name]["data_offsets"] = [0, 10 ** 12]
            encoded = json.dumps(header).encode()
            (path / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size:])
        elif kind == "unknown-architecture":
            config = json.loads((path / "config.json").read_text())
            config.update(architectures=["FrobnicatorForCausalLM"], model_type="frobnicator")
            (path / "config.json").write_text(json.dumps(config))
    return str(path)


# each bad model, and what its error line must name
CASES = {"missing": "missing", "text-file": "text-file", "empty.gguf": "empty", "garbage.gguf": "garbage.gguf",
         "truncated.gguf": "truncated.gguf", "broken-config": "config.json", "pickle-only": "pickle",
         "lying-header": "model.safetensors", "unknown-architecture": "FrobnicatorForCausalLM"}


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:") or " ERROR " in line]


@pytest.mark.parametrize("command", ["serve", "generate"])
@pytest.mark.parametrize("kind", list(CASES))
def test_a_bad_model_gives_one_error_line_and_a_nonzero_exit(kind, command, tiny_model, tmp_path):
    model = fabricate(kind, tiny_model, tmp_path)
    args = ["--port", str(free_port())] if command == "serve" else ["-p", "Hello", "--max-tokens", "2"]
    result = run_cli(command, model, *args)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    lines = error_lines(output)
    assert len(lines) == 1, output[-3000:]
    assert CASES[kind] in lines[0] and len(lines[0]) < 600, lines[0]


def test_the_traceback_is_shown_at_log_level_debug(tiny_model, tmp_path):
    model = fabricate("lying-header", tiny_model, tmp_path)
    result = run_cli("generate", model, "-p", "Hello", "--log-level", "debug")
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert error_lines(result.stderr)[-1].startswith("error: ValueError:")


def test_a_busy_port_fails_before_the_model_loads(tiny_model):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = run_cli("serve", str(tiny_model), "--port", str(port))
        took = time.monotonic() - started
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "KV cache" not in result.stderr and took < 60  # no engine was started


def test_a_second_sigint_exits_nonzero_without_a_traceback_per_stream(tiny_model, tmp_path):
    log = tmp_path / "server.log"
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--shutdown-timeout", "60", "--log-interval",
                        "0", log=log).wait_ready()
    try:
        streaming = threading.Semaphore(0)  # released once per stream, at its first line

        def stream() -> None:
            try:
                with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                                  json={"prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
                    for number, _ in enumerate(r.iter_lines()):
                        if number == 0:
                            streaming.release()
            except httpx.HTTPError:  # the forced exit cuts the streams
                pass

        streams = [threading.Thread(target=stream) for _ in range(3)]
        for thread in streams:
            thread.start()
        for _ in streams:  # signal while every stream is mid-way: a fast host finishes 400 tokens in about a second
            assert streaming.acquire(timeout=60)
        server.process.send_signal(signal.SIGINT)
        time.sleep(0.1)
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(30) == 128 + signal.SIGINT
        for thread in streams:
            thread.join(30)
        text = log.read_text(errors="replace")
        assert "CancelledError" not in text and "Traceback" not in text, text[-3000:]
    finally:
        server.stop()
