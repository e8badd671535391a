"""The real-model server for the cross-distribution server tests: ``tokenmill serve`` with no model
(the bundled SmolLM2-135M-Instruct GGUF), started once per session and killed by process group."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "server" / "tests"))  # the live-server helpers (server_live.py)

from server_live import LiveServer  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("smollm2-server") / "server.log"
    server = LiveServer(None, "--kv-cache-memory", "256MiB", "--max-model-len", "2048", "--max-num-seqs", "32",
                        "--max-waiting-requests", "32", "--log-interval", "2", log=log)
    try:
        server.wait_ready(timeout=300)
        yield server
    finally:
        server.stop()
