"""EventStreamResponse's bound on unsent output, driven as ASGI with a client that stops reading."""

import asyncio
import json

from tokenmill_server.event_stream import DONE, EventStreamResponse, StreamBudget, StreamGauge, data_event


def run_stream(frames: int, frame_bytes: int, limit: int, path: str = "/v1/completions", stall: bool = True):
    """Stream ``frames`` frames to a client whose first body write blocks until every frame was
    produced (when ``stall``); returns (body, produced, closed, gauge)."""
    gauge = StreamGauge()
    produced, closed = [], []

    async def content():
        for index in range(frames):
            produced.append(index)
            yield data_event({"i": index, "pad": "x" * frame_bytes})
            await asyncio.sleep(0)
        yield DONE

    async def main():
        unblock = asyncio.Event()
        body = []

        async def send(message):
            if message["type"] == "http.response.body":
                if stall and not body:
                    await unblock.wait()  # the client reads nothing for now
                body.append(message.get("body", b""))

        async def receive():
            await asyncio.Event().wait()

        response = EventStreamResponse(content(), on_close=lambda: closed.append(True),
                                       budget=StreamBudget(limit, gauge, path))
        task = asyncio.ensure_future(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send))
        for _ in range(10 * frames + 50):
            await asyncio.sleep(0)
        unblock.set()
        await asyncio.wait_for(task, 10)
        return b"".join(body)

    body = asyncio.run(main())
    return body, produced, closed, gauge


def test_a_stalled_reader_is_bounded_and_its_stream_stopped():
    body, produced, closed, gauge = run_stream(frames=200, frame_bytes=1000, limit=8192)
    assert gauge.slow_reader_aborts == 1 and closed
    assert len(produced) < 30  # the engine's output stopped being consumed soon after the bound
    assert gauge.max_stream_bytes <= 8192 and gauge.buffered_bytes == 0
    events = [chunk for chunk in body.split(b"\n\n") if chunk]
    error = json.loads(events[-2][len(b"data: "):])["error"]
    assert error["code"] == "slow_reader" and error["type"] == "timeout_error" and "8192 bytes" in error["message"]
    assert events[-1] == b"data: [DONE]"


def test_anthropic_stream_ends_with_an_error_event():
    body, _, _, gauge = run_stream(frames=100, frame_bytes=1000, limit=4096, path="/v1/messages")
    assert gauge.slow_reader_aborts == 1
    assert body.endswith(b"\n\n") and b"event: error\ndata: " in body and b"[DONE]" not in body


def test_a_reader_that_keeps_up_gets_everything():
    body, produced, closed, gauge = run_stream(frames=200, frame_bytes=1000, limit=8192, stall=False)
    assert gauge.slow_reader_aborts == 0 and len(produced) == 200 and closed
    assert body.count(b"data: ") == 201 and body.endswith(DONE) and gauge.buffered_bytes == 0


def test_one_frame_larger_than_the_bound_still_goes_out():
    body, _, _, gauge = run_stream(frames=1, frame_bytes=20_000, limit=8192, stall=False)
    assert gauge.slow_reader_aborts == 0 and body.endswith(DONE) and len(body) > 20_000
