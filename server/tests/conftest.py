"""Fixtures for the server's tests: a tiny random-weight model and ``tokenmill serve`` on it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the live-server helpers (server_live.py)

from server_live import LiveServer, build_tiny_model, free_port  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_server(tiny_model, tmp_path_factory):
    """One tiny-model server for the session: small caps so limits are reachable, gRPC on."""
    log = tmp_path_factory.mktemp("tiny-server") / "server.log"
    grpc_port = free_port()
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--max-num-seqs", "8",
                        "--max-waiting-requests", "8", "--max-body-size", "1MiB", "--max-n", "8",
                        "--max-stop-sequences", "4", "--max-logit-bias", "16", "--max-prompts-per-request", "4",
                        "--max-tools", "2", "--grpc-port", str(grpc_port), "--log-interval", "1", log=log)
    server.grpc_port = grpc_port
    try:
        yield server.wait_ready()
    finally:
        server.stop()
