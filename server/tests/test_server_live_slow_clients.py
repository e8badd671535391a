"""Slow clients against a live tiny-model server with short guards (reference section 6, A.7 and
I.66): a request trickled in is cut off by the read timeout with a 408, a stream read too slowly is
bounded in the server and stopped, and a client that reads nothing is dropped by the write timeout.
Other clients are served normally meanwhile, and the server stays healthy."""

import json
import socket
import statistics
import threading
import time

import httpx
import pytest
from server_live import LiveServer, assert_still_serving, metric_value

READ_TIMEOUT = 1.5
WRITE_TIMEOUT = 15.0
STREAM_BUFFER = 8192
SERVER_ARGS = ("--kv-cache-memory", "32MiB", "--max-num-seqs", "8", "--request-read-timeout", str(READ_TIMEOUT),
               "--write-timeout", str(WRITE_TIMEOUT), "--max-stream-buffer", str(STREAM_BUFFER),
               "--socket-send-buffer", "8KiB", "--log-interval", "0")


@pytest.fixture(scope="module")
def guarded_server(tiny_model, tmp_path_factory):
    server = LiveServer(str(tiny_model), *SERVER_ARGS, log=tmp_path_factory.mktemp("guarded") / "server.log")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def still_serving_afterwards(guarded_server):
    yield
    assert_still_serving(guarded_server.url)


def timeouts(server, kind):
    return metric_value(server.url, f'tokenmill:connection_timeouts_total{{kind="{kind}"')


def wait_for_idle(url, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric_value(url, "tokenmill:num_requests_running{") == 0 and \
                metric_value(url, "tokenmill:kv_cache_usage_perc{") == 0:
            return True
        time.sleep(0.1)
    return False


def read_until_closed(sock, limit=5.0) -> bytes:
    sock.settimeout(limit)
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return reply


def raw_post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), len(data)) + data)


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost: x\r\n"], ids=["nothing", "half-headers"])
def test_stalled_request_gets_408_while_others_are_served(guarded_server, sent):
    before = timeouts(guarded_server, "read")
    with socket.create_connection(("127.0.0.1", guarded_server.port)) as slow:
        started = time.monotonic()
        slow.sendall(sent)
        response = httpx.post(guarded_server.url + "/v1/completions", timeout=10,
                              json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert response.status_code == 200 and time.monotonic() - started < READ_TIMEOUT
        reply = read_until_closed(slow, limit=READ_TIMEOUT + 5)
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"code": "request_timeout"' in reply
    assert READ_TIMEOUT - 0.1 <= elapsed < READ_TIMEOUT + 3
    assert timeouts(guarded_server, "read") == before + 1


def test_trickled_body_is_cut_off(guarded_server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"prompt\": \"")
    sent, closed = 0, False
    with socket.create_connection(("127.0.0.1", guarded_server.port)) as slow:
        started = time.monotonic()
        slow.sendall(head)
        slow.settimeout(0.1)
        reply = b""
        while time.monotonic() - started < READ_TIMEOUT + 5:
            try:
                slow.sendall(b"a")  # one byte every ~0.1 s: the whole body would take 100 s
                sent += 1
                chunk = slow.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            reply += chunk
            assert httpx.get(guarded_server.url + "/health", timeout=5).status_code == 200
        elapsed = time.monotonic() - started
    assert closed and reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert sent < 1000 and elapsed < READ_TIMEOUT + 3


def test_complete_request_sent_in_pieces_within_the_timeout_is_served(guarded_server):
    request = raw_post("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "ignore_eos": True})
    with socket.create_connection(("127.0.0.1", guarded_server.port)) as sock:
        for piece in (request[:20], request[20:60], request[60:]):
            sock.sendall(piece)
            time.sleep(READ_TIMEOUT / 4)
        sock.settimeout(10)
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def stream_gaps(url: str, max_tokens: int = 120) -> list[float]:
    """Seconds between the data events of a normally read completion stream."""
    gaps, last = [], None
    body = {"prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
    assert len(gaps) >= max_tokens
    return gaps


def test_slow_reader_is_bounded_then_stopped_and_others_keep_their_pace(guarded_server):
    url = guarded_server.url
    baseline = stream_gaps(url)
    aborts = metric_value(url, "tokenmill:slow_reader_aborts_total")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    slow.connect(("127.0.0.1", guarded_server.port))
    slow.sendall(raw_post("/v1/completions", {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True,
                                              "stream": True, "logprobs": 5}))
    buffered, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            buffered.append(metric_value(url, "tokenmill:stream_buffered_bytes{"))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        slow.settimeout(1.0)
        slow.recv(1)  # reads a byte a second
        during = stream_gaps(url)
        deadline = time.monotonic() + 30
        while metric_value(url, "tokenmill:slow_reader_aborts_total") == aborts and time.monotonic() < deadline:
            slow.recv(1)
            time.sleep(1.0)
    finally:
        stop.set()
        sampler.join()
    assert metric_value(url, "tokenmill:slow_reader_aborts_total") == aborts + 1
    assert max(buffered) <= STREAM_BUFFER
    assert metric_value(url, "tokenmill:stream_buffered_bytes_max") <= STREAM_BUFFER
    assert wait_for_idle(url)  # aborted: its KV blocks are free
    tail = read_until_closed(slow, limit=3.0)
    slow.close()
    assert b'"code":"slow_reader"' in tail and tail.rstrip(b"\r\n0").endswith(b"data: [DONE]")
    # the slow reader never holds up the others: a stream read meanwhile keeps its usual pace
    assert statistics.median(during) <= 2 * statistics.median(baseline) + 0.05, (baseline, during)
    assert max(during) < 2.0


def test_client_that_reads_nothing_is_dropped_by_the_write_timeout(guarded_server):
    url = guarded_server.url
    before = timeouts(guarded_server, "write")
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        stalled.connect(("127.0.0.1", guarded_server.port))
        stalled.sendall(raw_post("/v1/completions", {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True,
                                                     "stream": True, "logprobs": 5}))
        deadline = time.monotonic() + WRITE_TIMEOUT + 60
        while timeouts(guarded_server, "write") == before and time.monotonic() < deadline:
            assert httpx.get(url + "/health", timeout=5).status_code == 200
            time.sleep(0.5)
        assert timeouts(guarded_server, "write") == before + 1
        assert read_until_closed(stalled, limit=3.0) is not None  # the connection is gone (EOF or reset)
    assert wait_for_idle(url)
