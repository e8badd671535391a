"""serve(): load the engine, then open the port; drain on SIGTERM; exit when the engine dies.

Lifecycle: the engine process loads the model while this process loads the tokenizer; only then
does uvicorn bind, so a client never sees a port that cannot answer. The first SIGTERM/SIGINT
stops accepting (new requests and /health get 503), lets running requests finish for up to
``--shutdown-timeout`` seconds, aborts the rest with an error, and exits 0; a second one exits at
once, with 128 + the signal's number. If the engine dies, /health turns 503, running requests get errors, and the server exits 1
(unless ``--keep-alive-on-engine-death``).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import threading
import time
from typing import Any

import uvicorn

from tokenmill.config import EngineArgs
from tokenmill.frontend.async_llm import AsyncLLM, EngineDeadError
from tokenmill_server.accept_error_log import AcceptErrorLog
from tokenmill_server.app import build_app
from tokenmill_server.connection_cap import (
    ConnectionCap,
    accept_batch,
    default_max_connections,
    raise_open_file_limit,
)
from tokenmill_server.http_protocol import GuardedH11Protocol
from tokenmill_server.listener import PortUnavailableError, bind_listener, deepen_queue
from tokenmill_server.server_args import ServerSettings
from tokenmill_server.state import ServerState
from tokenmill_server.throughput_log import ThroughputLog

logger = logging.getLogger("tokenmill.server")
_ABORT_FLUSH_SECONDS = 0.5
_DEATH_EXIT_DELAY = 1.0


class _UvicornServer(uvicorn.Server):
    """uvicorn with tokenmill's shutdown: signals start a drain instead of an immediate exit."""

    def __init__(self, config: uvicorn.Config, state: ServerState, settings: ServerSettings, grpc: Any,
                 launched: float) -> None:
        super().__init__(config)
        self.launched = launched
        self.state = state
        self.settings = settings
        self.grpc = grpc
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        for sock in sockets or ():
            deepen_queue(sock)
        if self.started:
            logger.info("tokenmill serve: %s ready on http://%s:%d%s; startup took %.1f s", self.state.model.name,
                        self.config.host, self.config.port,
                        f" and gRPC port {self.settings.grpc_port}" if self.grpc else "",
                        time.monotonic() - self.launched)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.state.draining:  # a second signal: stop now, failing as a process killed by it
            self.exit_code = 128 + int(sig)
            self.force_exit = True
            self.should_exit = True
            return
        self.state.draining = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_drain)
        else:
            self.should_exit = True

    def _begin_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        """Stop accepting, wait for running requests up to the timeout, abort the rest, exit."""
        engine = self.state.engine
        if self.grpc is not None:
            self.grpc.set_serving(False)
        deadline = time.monotonic() + self.settings.shutdown_timeout
        logger.info("shutting down: %d requests running, waiting up to %.0f s", engine.num_unfinished_requests,
                    self.settings.shutdown_timeout)
        while engine.num_unfinished_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted = engine.abort_all("The server is shutting down.")
        if aborted:
            logger.info("aborted %d requests", aborted)
            await asyncio.sleep(_ABORT_FLUSH_SECONDS)  # let their error responses go out
        self.should_exit = True

    def engine_died(self, error: EngineDeadError) -> None:
        if self.settings.keep_alive_on_engine_death:
            return
        self.exit_code = 1
        if self.grpc is not None:
            self.grpc.set_serving(False)
        asyncio.get_running_loop().call_later(_DEATH_EXIT_DELAY, setattr, self, "should_exit", True)


class _CancelledRequestFilter(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" for a request whose task was cancelled because the
    server stopped at once (a second signal): a traceback per open stream would say nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


def _import_quietly(name: str) -> None:
    """Import ``name`` ahead of need; a failure shows up, with its message, where it is needed."""
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - reported by the import that needs it
        pass


async def serve(engine_args: EngineArgs, settings: ServerSettings, plugin_manager: Any = None) -> int:
    """Run the server until shutdown; returns the process exit code."""
    started = time.monotonic()
    # xgrammar checks structured-output requests; importing it takes ~1.6 s, better spent while the engine
    # process loads than in the event loop at the first constrained request
    try:
        listener = bind_listener(settings.host, settings.port)  # a busy port fails now, not after the load
    except PortUnavailableError as error:
        logger.error("%s", error)
        return 1
    threading.Thread(target=_import_quietly, args=("xgrammar",), name="import-xgrammar", daemon=True).start()
    try:
        engine = await AsyncLLM.from_engine_args(engine_args, max_waiting_requests=settings.max_waiting_requests,
                                                 ready_timeout=settings.ready_timeout)
    except EngineDeadError as error:
        listener.close()
        logger.error("%s", error)
        return 1
    ready = engine.ready
    cache = f"{ready.num_kv_blocks} KV blocks of {ready.block_size} tokens" if ready.can_generate else \
        "an embedding model: /v1/embeddings only"
    logger.info("engine ready in %.1f s (%s on %s, %s, max_model_len %d)", time.monotonic() - started,
                ready.served_model_name, ready.device, cache, ready.max_model_len)
    grpc = None
    log_task = None
    try:
        app = build_app(engine, settings, plugin_manager)
        state: ServerState = app.state.server
        if settings.grpc_port is not None:
            from tokenmill_server.grpc_api.service import start_grpc_server

            grpc = await start_grpc_server(state, settings)
        file_limit = raise_open_file_limit()
        cap = ConnectionCap(settings.max_connections or default_max_connections(file_limit))
        logger.info("accepting up to %d HTTP connections at once (open-file limit %d)", cap.limit, file_limit)
        AcceptErrorLog().install()
        http = GuardedH11Protocol.factory(settings.request_read_timeout, settings.write_timeout,
                                          settings.socket_send_buffer, state.metrics.connection_timed_out, state.health,
                                          cap)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, http=http, lifespan="off",
                                log_level=settings.uvicorn_log_level, timeout_graceful_shutdown=5,
                                access_log=False, backlog=accept_batch(file_limit))
        server = _UvicornServer(config, state, settings, grpc, started)
        logging.getLogger("uvicorn.error").addFilter(_CancelledRequestFilter())
        gc.collect()
        gc.freeze()  # the startup heap (transformers, the tokenizer) is permanent: keep GC pauses short
        engine.on_death(server.engine_died)
        if settings.log_interval > 0:
            throughput = ThroughputLog(settings.log_interval)
            engine.add_stats_listener(throughput.observe)
            log_task = asyncio.ensure_future(throughput.run())
        await server.serve(sockets=[listener])
        return server.exit_code if server.started else 1
    finally:
        listener.close()
        if log_task is not None:
            log_task.cancel()
        if grpc is not None:
            await grpc.stop(grace=1.0)
        await engine.shutdown()
