"""EngineCoreClient: starts the engine-core process and talks to it over ZMQ IPC with msgpack.

The sockets live in a private (0700) temporary directory; the child runs in its own process group,
which ``shutdown`` kills as a whole. Sends never block (the request socket has no high-water mark);
``get_output`` is awaited by one asyncio task and notices the child's death within half a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from typing import Any

import zmq
import zmq.asyncio

from tokenmill import wire
from tokenmill.config import EngineArgs
from tokenmill.wire import (
    EngineCoreEmbeddings,
    EngineCoreEmbedRequest,
    EngineCoreFailure,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
)

logger = logging.getLogger("tokenmill")

_POLL_MS = 500


class EngineDeadError(RuntimeError):
    """The engine-core process stopped (crashed, was killed, or failed to start)."""


class EngineCoreClient:
    """The front end's handle on one engine-core process."""

    def __init__(self, process: subprocess.Popen, socket_dir: str, requests: zmq.Socket,
                 outputs: zmq.asyncio.Socket, contexts: tuple[zmq.Context, zmq.asyncio.Context]) -> None:
        self.process = process
        self.ready: EngineCoreReady | None = None
        self._socket_dir = socket_dir
        self._requests = requests
        self._outputs = outputs
        self._contexts = contexts
        self._closed = False

    @classmethod
    async def start(cls, args: EngineArgs) -> EngineCoreClient:
        """Start the process and return as soon as it runs; ``wait_ready`` waits for the model."""
        socket_dir = tempfile.mkdtemp(prefix="tokenmill-")  # mode 0700: only this user reaches the sockets
        request_address, output_address = f"ipc://{socket_dir}/requests", f"ipc://{socket_dir}/outputs"
        sync_context, async_context = zmq.Context(), zmq.asyncio.Context()
        requests = sync_context.socket(zmq.PUSH)
        requests.setsockopt(zmq.SNDHWM, 0)
        requests.setsockopt(zmq.LINGER, 0)
        requests.bind(request_address)
        outputs = async_context.socket(zmq.PULL)
        outputs.setsockopt(zmq.RCVHWM, 0)
        outputs.bind(output_address)
        command = [sys.executable, "-m", "tokenmill.engine_core.core_process", "--requests", request_address,
                   "--outputs", output_address, "--parent-pid", str(os.getpid())]
        # Popen from this (main) thread: the child's parent-death signal fires when this thread exits
        process = subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True)
        process.stdin.write(json.dumps(asdict(args)).encode())
        process.stdin.close()
        return cls(process, socket_dir, requests, outputs, (sync_context, async_context))

    async def wait_ready(self, timeout: float | None = None) -> EngineCoreReady:
        """Wait until the model is loaded; EngineDeadError if the process fails or the timeout passes."""
        try:
            kind, payload = await asyncio.wait_for(self._receive(), timeout)
        except TimeoutError:
            raise EngineDeadError(f"the engine was not ready within {timeout:.0f} s") from None
        if kind == wire.DEAD:
            raise EngineDeadError(f"the engine failed to start: {wire.decode(kind, payload).message}")
        if kind != wire.READY:
            raise EngineDeadError(f"the engine sent {kind[:32]!r} before it was ready")
        self.ready = wire.decode(kind, payload)
        return self.ready

    async def get_output(self) -> EngineCoreOutputs | EngineCoreEmbeddings | EngineCoreFailure:
        """The next step's outputs, a finished embedding request, or a refused request
        (EngineCoreFailure with its request id). Raises EngineDeadError when the engine reports a
        fatal error or its process is gone."""
        while True:
            kind, payload = await self._receive()
            if kind in (wire.OUTPUTS, wire.EMBEDDINGS, wire.REJECTED):
                return wire.decode(kind, payload)
            if kind == wire.DEAD:
                raise EngineDeadError(wire.decode(kind, payload).message)
            logger.warning("engine client: ignored a message of kind %r", kind[:32])

    async def _receive(self) -> tuple[bytes, bytes]:
        while True:
            if self._closed:
                raise EngineDeadError("the engine client was shut down")
            if await self._outputs.poll(_POLL_MS):
                frames = await self._outputs.recv_multipart()
                return frames[0], frames[1] if len(frames) > 1 else b""
            code = self.process.poll()
            if code is not None:
                raise EngineDeadError(f"the engine process exited unexpectedly (exit code {code})")

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        """Queue requests in one message (the engine takes them in the same loop turn)."""
        self._send(wire.ADD, requests)

    def embed(self, request: EngineCoreEmbedRequest) -> None:
        """Queue prompts to embed; the reply is an EngineCoreEmbeddings (or a refusal) from ``get_output``."""
        self._send(wire.EMBED, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Stop requests in the core; nothing to do once it is gone (``get_output`` reports that)."""
        if request_ids:
            self._send(wire.ABORT, request_ids, required=False)

    def finish_requests(self, request_ids: list[str]) -> None:
        """End requests the front end saw stop (a stop string); the core frees them."""
        if request_ids:
            self._send(wire.FINISH, request_ids, required=False)

    def _send(self, kind: bytes, payload: Any, required: bool = True) -> None:
        """Send without blocking. The request socket has no high-water mark, so a send fails only when the
        core's end is gone: EngineDeadError when the message mattered (``required``), else nothing."""
        if self._closed:
            if required:
                raise EngineDeadError("the engine client was shut down")
            return
        try:
            self._requests.send_multipart(wire.frame(kind, payload), flags=zmq.NOBLOCK)
        except zmq.ZMQError as error:
            if required:
                code = self.process.poll()
                raise EngineDeadError("the engine process exited unexpectedly" +
                                      (f" (exit code {code})" if code is not None else f" ({error})")) from None

    @property
    def socket_dir(self) -> str:
        """The private directory holding the IPC sockets (removed by ``shutdown``)."""
        return self._socket_dir

    @property
    def is_alive(self) -> bool:
        return not self._closed and self.process.poll() is None

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the engine to stop, then end its whole process group; remove the socket directory."""
        if self._closed:
            return
        if self.process.poll() is None:
            try:
                self._requests.send_multipart(wire.frame(wire.SHUTDOWN), flags=zmq.NOBLOCK)
                self.process.wait(timeout / 2)
            except (zmq.ZMQError, subprocess.TimeoutExpired):
                pass
        self._kill_group(signal.SIGTERM, timeout / 2)
        self._kill_group(signal.SIGKILL, timeout)
        self._closed = True
        self._requests.close(linger=0)
        self._outputs.close(linger=0)
        for context in self._contexts:
            context.term()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _kill_group(self, sig: int, wait: float) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            self.process.wait(wait)
        except subprocess.TimeoutExpired:
            pass
