"""Requests that arrive just as the engine process dies (issue 28, item 6): before the front end's poll
notices, a send to the dead engine failed with zmq's ``Again`` and the client got a 500. Now every such
request gets a 503, the server exits 1, and the engine's socket directory is removed."""

import os
import threading
import time

import httpx
import psutil
from server_live import LiveServer

BURST = 24


def test_requests_racing_the_engine_death_get_503_and_the_socket_directory_goes(tiny_model, tmp_path):
    server = LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--log-interval", "0",
                        log=tmp_path / "server.log").wait_ready()
    try:
        engine = next(c for c in psutil.Process(server.process.pid).children(recursive=True)
                      if "tokenmill.engine_core.core_process" in " ".join(c.cmdline()))
        address = next(arg for arg in engine.cmdline() if arg.startswith("ipc://"))
        socket_dir = os.path.dirname(address[len("ipc://"):])
        clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(BURST)]
        for client in clients:
            client.get("/health")  # connected beforehand, so the burst is only the requests
        statuses: list[int | str] = []
        start = threading.Barrier(BURST + 1)

        def request(client: httpx.Client, delay: float) -> None:
            start.wait()
            time.sleep(delay)
            try:
                response = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
                statuses.append(response.status_code)
                if response.status_code != 200:
                    assert "\n" not in response.json()["error"]["message"]
            except httpx.HTTPError as error:  # the server may already be closing its connections
                statuses.append(type(error).__name__)

        threads = [threading.Thread(target=request, args=(client, i * 0.02)) for i, client in enumerate(clients)]
        for thread in threads:
            thread.start()
        engine.kill()
        start.wait()  # the burst spans the half second before the front end's poll notices the death
        for thread in threads:
            thread.join(60)
        assert 500 not in statuses, statuses
        assert 503 in statuses, statuses
        assert server.process.wait(30) == 1
        assert not os.path.exists(socket_dir)
        assert "Traceback" not in server.log_tail(100_000)
    finally:
        server.stop()
