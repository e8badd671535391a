"""Running requests on the AsyncLLM for the HTTP handlers: engine errors as API errors, client
disconnects as aborts, and several prompts of one request merged into one stream."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import TypeVar

from starlette.requests import Request

from tokenmill.frontend.async_llm import (
    EngineDeadError,
    QueueFullError,
    RequestAbortedError,
    RequestRejectedError,
)
from tokenmill.frontend.input_processor import PromptTooLongError
from tokenmill.outputs import RequestOutput
from tokenmill_server.errors import ApiError, bad_request, overloaded, unavailable

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


def new_request_id(prefix: str) -> str:
    """Server-generated ids only: a client-supplied id could collide with another client's."""
    return f"{prefix}-{uuid.uuid4().hex}"


def check_text(text: str, param: str) -> str:
    """400 for text that is not valid Unicode (lone surrogates cannot be tokenized)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("The text contains invalid Unicode (a lone surrogate).", param) from None
    return text


@contextlib.contextmanager
def engine_errors(metrics=None) -> Iterator[None]:
    """Turn the engine's exceptions into API errors (raised inside a handler or a stream)."""
    try:
        yield
    except QueueFullError as error:
        if metrics is not None:
            metrics.admission_rejected()
        raise overloaded(str(error)) from None
    except PromptTooLongError as error:
        raise ApiError(400, str(error), param="input_tokens", code="context_length_exceeded") from None
    except RequestRejectedError as error:
        raise bad_request(f"The engine cannot run this request: {error}") from None
    except RequestAbortedError as error:
        raise unavailable(str(error)) from None
    except EngineDeadError:  # 503: the server is going away (or serves only 503s), the request was sound
        raise ApiError(503, "The engine stopped; the server cannot serve requests.", code="engine_dead") from None
    except ValueError as error:
        raise bad_request(str(error)) from None


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def final_output(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    """The last RequestOutput of a stream (FINAL_ONLY requests yield just one)."""
    last = None
    async for output in stream:
        last = output
    assert last is not None and last.finished, "a request stream ended without a finished output"
    return last


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as they come, tagged with the iterator's index. Closing
    the merged iterator (or one stream failing) closes every stream, which aborts its request."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as error:
            await queue.put((index, error))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
