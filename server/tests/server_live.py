"""Helpers for tests that drive a live ``tokenmill serve``: a tiny random-weight model, a free port,
and a server subprocess in its own process group (killed as a group when done)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello, my name is Tokenmill and I serve models.",
           "One two three four five six seven eight nine ten.", "Paris is the capital of France.",
           "0123456789 !?.,;:'\"()[]{}<>/\\|@#$%^&*-+=_~` abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"]


def build_tiny_model(target: Path) -> Path:
    """A 2-layer Llama with random weights and a small byte-level BPE tokenizer with a ChatML template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (target / "config.json").exists():
        return target
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(_CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", bos_token="<|im_start|>",
                                        unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True)
    target.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """``tokenmill serve`` as a subprocess; ``url`` once it answers /health."""

    def __init__(self, model: str | None, *extra: str, env: dict[str, str] | None = None, log: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "tokenmill.cli.main", "serve", *([model] if model else []),
                   "--port", str(self.port), *extra]
        self.log_path = log
        self._log = open(log, "wb") if log else subprocess.DEVNULL
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)
        self.ready_after: float | None = None

    def wait_ready(self, timeout: float = 240.0) -> LiveServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tokenmill serve exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    self.ready_after = time.monotonic() - self.started
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tokenmill serve was not ready within {timeout} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-chars:]

    def engine_pids(self) -> list[int]:
        """Pids of the server's child processes (the engine core)."""
        import psutil

        return [child.pid for child in psutil.Process(self.process.pid).children(recursive=True)]

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL the server's process group; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = self.process.wait(10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return code


def sse_events(response: httpx.Response) -> list[tuple[str | None, str]]:
    """(event name, data) of every event of a finished SSE response."""
    events, name, data = [], None, []
    for line in response.iter_lines():
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    if data:
        events.append((name, "\n".join(data)))
    return events


def json_events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of an OpenAI-style stream, without the final [DONE]."""
    return [json.loads(data) for _, data in sse_events(response) if data != "[DONE]"]


def assert_still_serving(url: str, headers: dict[str, str] | None = None) -> None:
    """/health is 200 and a normal completion succeeds (every fault case ends with this)."""
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    response = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "ignore_eos": True},
                          headers=headers,
                          timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


def metric_value(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    """The value of one sample line of /metrics (``name`` includes its labels, e.g. 'x{a="b"}' prefix)."""
    return metric_in(httpx.get(url + "/metrics", headers=headers, timeout=10).text, name)


def metric_in(text: str, name: str) -> float:
    """The value of the sample line of a /metrics page ``text`` that starts with ``name``."""
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
