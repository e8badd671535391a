"""Connection floods (issue 28, item 2): a cap on open connections that makes room by closing the
longest-idle ones, and a rate-limited accept-error log. The live cases run servers whose open-file
limit is lowered to 1024 (so a flood of 3000 idle connections is quick); the acceptance figure is
20,000 idle connections against the host's limit."""

import asyncio
import errno
import logging
import os
import resource
import socket
import time

import httpx
import pytest
from server_live import LiveServer, assert_still_serving

from tokenmill_server.accept_error_log import ACCEPT_FAILED, AcceptErrorLog
from tokenmill_server.connection_cap import IN_FLIGHT_TURNS, ConnectionCap, accept_batch, default_max_connections
from tokenmill_server.rate_limited_log import RateLimitedLog

FILE_LIMIT = 1024
FLOOD = 3000


def lowered_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def start(tiny_model, log, *extra):
    return LiveServer(str(tiny_model), "--kv-cache-memory", "32MiB", "--log-interval", "0", *extra, log=log,
                      preexec_fn=lowered_file_limit).wait_ready()


def flood(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that never send a byte (connecting without waiting for the server)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        sockets.append(sock)
    return sockets


def health_latencies(url: str, probes: int = 8) -> list[float | str]:
    """Seconds each /health took on a new connection (the error's name when it failed)."""
    latencies = []
    for _ in range(probes):
        started = time.monotonic()
        try:
            status = httpx.get(url + "/health", timeout=5).status_code
            latencies.append(time.monotonic() - started if status == 200 else f"status {status}")
        except httpx.HTTPError as error:
            latencies.append(type(error).__name__)
        time.sleep(0.25)
    return latencies


@pytest.fixture(scope="module")
def capped(tiny_model, tmp_path_factory):
    server = start(tiny_model, tmp_path_factory.mktemp("flood") / "capped.log")
    try:
        yield server
    finally:
        server.stop()


def test_health_answers_within_a_second_under_a_flood_of_idle_connections(capped):
    before = os.path.getsize(capped.log_path)
    held = flood(capped.port, FLOOD)
    try:
        latencies = health_latencies(capped.url)
        assert all(isinstance(s, float) and s < 1.0 for s in latencies), latencies
        response = httpx.post(capped.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1}, timeout=30)
        assert response.status_code == 200
    finally:
        for sock in held:
            sock.close()
    assert os.path.getsize(capped.log_path) - before < 1 << 20
    assert f"accepting up to {default_max_connections(FILE_LIMIT)} HTTP connections" in capped.log_tail(200_000)
    assert_still_serving(capped.url)


def test_without_a_cap_below_the_file_limit_the_accept_errors_are_logged_a_few_times(tiny_model, tmp_path):
    """--max-connections above the open-file limit: accept() runs out of files, and says so in one
    line every ten seconds instead of thousands of tracebacks a second."""
    log = tmp_path / "uncapped.log"
    server = start(tiny_model, log, "--max-connections", "100000")
    try:
        before = os.path.getsize(log)
        held = flood(server.port, FLOOD)
        time.sleep(3.0)  # accept() keeps failing while the flood holds every file
        for sock in held:
            sock.close()
        assert os.path.getsize(log) - before < 1 << 20
        text = log.read_text(errors="replace")
        assert "cannot accept new connections (EMFILE" in text, server.log_tail()
        assert text.count("cannot accept new connections") <= 2 and "Traceback" not in text
        assert_still_serving(server.url)
    finally:
        server.stop()


# -- the parts, without a server ----------------------------------------------------------------------------------

class Connection:
    """A connection as the cap sees it; ``evict`` records that the cap closed it."""

    def __init__(self) -> None:
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_the_cap_evicts_the_longest_idle_connection_and_never_a_busy_one():
    cap = ConnectionCap(3)
    a, b, c, d, e, f, g = (Connection() for _ in range(7))
    for connection in (a, b, c):
        assert cap.admit(connection)  # new connections are idle, in the order they came
    cap.busy(a)
    cap.busy(b)
    cap.idle(b)  # its response ended: idle again, after c
    assert cap.admit(d) and c.evicted and not (a.evicted or b.evicted)
    assert cap.admit(e) and b.evicted
    cap.busy(d)
    assert cap.admit(f) and e.evicted and not (a.evicted or d.evicted)
    cap.busy(f)
    assert cap.num_open == 3
    assert not cap.admit(g) and cap.refused == 1 and cap.num_open == 3  # every one busy: the new one is refused
    cap.closed(a)
    assert cap.admit(g) and cap.num_open == 3 and cap.evicted == 3
    assert not any(x.evicted for x in (a, d, f, g))


def test_the_default_cap_leaves_headroom_for_other_files_and_connections_in_flight():
    for limit in (256, 1024, 20000, 1 << 20):
        cap, batch = default_max_connections(limit), accept_batch(limit)
        assert 0 < cap and cap + IN_FLIGHT_TURNS * batch + 64 <= limit
    assert accept_batch(20000) == 512 and default_max_connections(20000) == 20000 - 2500 - IN_FLIGHT_TURNS * 512
    assert default_max_connections(1 << 20) == 32768


def test_rate_limited_log_counts_what_it_left_out(caplog):
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("tokenmill.server"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="tokenmill.server"):
        assert log.emit("full %d", 1)
        assert not any(log.emit("full %d", 1) for _ in range(5000))
        now[0] = 12.0
        assert log.emit("full %d", 1)
    assert [r.getMessage() for r in caplog.records] == [
        "full 1", "full 1 (5000 more like it in the last 12 s not logged)"]


def test_accept_errors_are_rate_limited_and_other_loop_errors_pass_through(caplog):
    loop = asyncio.new_event_loop()
    try:
        handler = AcceptErrorLog()
        loop.set_exception_handler(handler)
        with caplog.at_level(logging.WARNING):
            for _ in range(5000):
                loop.call_exception_handler({"message": ACCEPT_FAILED,
                                             "exception": OSError(errno.EMFILE, "Too many open files")})
            loop.call_exception_handler({"message": "something else broke", "exception": ValueError("x")})
    finally:
        loop.close()
    accept_lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(accept_lines) == 1 and "EMFILE" in accept_lines[0].getMessage() and accept_lines[0].exc_info is None
    assert any("something else broke" in r.getMessage() for r in caplog.records)
