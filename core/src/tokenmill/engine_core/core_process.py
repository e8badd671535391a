"""The engine-core process: an EngineCore behind two ZMQ IPC sockets, run until SHUTDOWN.

Started by ``EngineCoreClient`` as ``python -m tokenmill.engine_core.core_process`` (a fresh
interpreter, never multiprocessing: nothing is pickled). The parent writes the EngineArgs as JSON
to stdin; every later message travels as the wire module's frames (``tokenmill.wire``):
requests in on a PULL socket, READY, step outputs, embeddings and failures out on a PUSH socket.

An embedding request's prompts become pooling requests of the same scheduler (``EngineCore.add_embedding``),
so they are batched into the steps with everything else; its rows are sent once its last prompt is pooled.

The process dies with its parent: PR_SET_PDEATHSIG on Linux plus a watchdog on the parent's pid.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import zmq

from tokenmill import wire
from tokenmill.log_level import current_log_level, failure_summary, tracebacks_wanted
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill.wire import (
    CANNOT_GENERATE,
    EngineCoreEmbeddings,
    EngineCoreEmbedRequest,
    EngineCoreFailure,
    EngineCoreOutputs,
    EngineCoreReady,
)

logger = logging.getLogger("tokenmill")

_IDLE_POLL_MS = 1000
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Exit when ``parent_pid`` goes away: the kernel's parent-death signal where there is one
    (Linux), and everywhere a thread that checks the parent's pid once a second."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def can_generate(model: Any) -> bool:
    """False for encoder-only models: they embed whole sequences and have no decoding step."""
    return not model.is_encoder


def ready_message(config: Any, loaded_model: Any = None, num_kv_blocks: int | None = None) -> EngineCoreReady:
    """The READY payload for a resolved EngineConfig (and the model loaded from it); ``num_kv_blocks``
    is the cache actually allocated (after GPU memory profiling it differs from the resolver's estimate)."""
    model, platform = config.model, config.selection.platform_instance
    return EngineCoreReady(
        served_model_name=model.served_model_name, model_path=model.path, tokenizer_path=model.tokenizer_path,
        architecture=model.architecture, dtype=model.dtype, quantization=model.quantization,
        max_model_len=model.max_model_len, vocab_size=model.vocab_size, eos_token_ids=list(model.eos_token_ids),
        generation_defaults=dict(model.generation_defaults), chat_template=model.chat_template,
        max_logprobs=config.max_logprobs, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, scheduling_policy=config.scheduling_policy,
        num_kv_blocks=num_kv_blocks or config.cache.num_blocks, block_size=config.cache.block_size, platform=platform.name,
        device=str(platform.torch_device()), report=config.render_report(), can_generate=can_generate(loaded_model),
        embedding_size=model.hidden_size)


class EngineCoreProc:
    """The busy loop: take every queued message, run one step while there is work (generation and
    embedding requests alike), send the outputs and the finished embeddings. With nothing to do it
    captures the graphs the builder deferred, one per turn, checking for messages between them."""

    def __init__(self, core: Any, config: Any, requests: zmq.Socket, outputs: zmq.Socket) -> None:
        self.core = core
        self.config = config
        self.requests = requests
        self.outputs = outputs
        self._poller = zmq.Poller()
        self._poller.register(requests, zmq.POLLIN)
        self._running = True
        self._last_stats: SchedulerStats | None = None
        self._can_generate = can_generate(core.runner.model)
        self._pooling: Any = None  # the model's PoolingConfig, resolved at the first embedding request

    def run(self) -> None:
        idle_work_left = True  # graphs the builder left for idle time, KV cache pages not yet backed
        while self._running:
            busy = self.core.has_unfinished_requests()
            if not busy and idle_work_left and not self._poller.poll(0):
                idle_work_left = self.core.runner.work_while_idle()
                continue
            if self._poller.poll(0 if busy else _IDLE_POLL_MS):
                self._drain_requests()
            if self._running and self.core.has_unfinished_requests():
                self._send_step(self.core.step())
                self._send_embeddings()

    def _drain_requests(self) -> None:
        while self._running:
            try:
                kind, payload = self.requests.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle(kind, payload)

    def _handle(self, kind: bytes, payload: bytes) -> None:
        try:
            message = wire.decode(kind, payload)
        except KeyError:
            logger.warning("engine core: ignored a message of unknown kind %r", kind[:32])
            return
        if kind == wire.ADD:
            for request in message:
                try:
                    if not self._can_generate:
                        raise ValueError(CANNOT_GENERATE)
                    self.core.add_request(request)
                except ValueError as error:
                    self._reject(request.request_id, str(error))
        elif kind == wire.EMBED:
            self._add_embedding(message)
        elif kind == wire.ABORT:
            self.core.abort_requests(message)
        elif kind == wire.FINISH:
            self.core.finish_requests(message, stop_reason=None)
        elif kind == wire.SHUTDOWN:
            self._running = False
        else:
            logger.warning("engine core: ignored a message of kind %r", kind[:32])

    def _reject(self, request_id: str, message: str) -> None:
        self.outputs.send_multipart(wire.frame(wire.REJECTED, EngineCoreFailure(message, request_id)))

    def _add_embedding(self, request: EngineCoreEmbedRequest) -> None:
        """Queue an embedding request's prompts as pooling requests; a ValueError (a prompt that can never
        run, a pooling the model directory declares but tokenmill lacks) refuses that request only."""
        try:
            if self._pooling is None:
                from tokenmill.engine_core.embedding import model_pooling

                self._pooling = model_pooling(self.core.runner.model, self.config.model.path)
            self.core.add_embedding(request.request_id, request.prompts, self._pooling)
        except ValueError as error:
            self._reject(request.request_id, str(error))
            return
        self._send_embeddings()  # a request without prompts is finished at once

    def _send_embeddings(self) -> None:
        for request_id, rows in self.core.take_embeddings().items():
            self.outputs.send_multipart(wire.frame(wire.EMBEDDINGS, EngineCoreEmbeddings.from_array(request_id, rows)))

    def _send_step(self, step: EngineCoreOutputs) -> None:
        """Send a step that produced outputs or changed the scheduler's stats (an idle turn sends nothing)."""
        if step.outputs or step.scheduler_stats != self._last_stats:
            self.outputs.send_multipart(wire.frame(wire.OUTPUTS, step))
            self._last_stats = step.scheduler_stats


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tokenmill.engine_core.core_process",
                                     description="The tokenmill engine core (started by the server; EngineArgs "
                                                 "as JSON on stdin).")
    parser.add_argument("--requests", required=True, help="ZMQ address to pull requests from")
    parser.add_argument("--outputs", required=True, help="ZMQ address to push outputs to")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when this process goes away")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the engine core until SHUTDOWN, a fatal error, or the parent's death."""
    options = _parse_args(argv)
    die_with_parent(options.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    logging.basicConfig(level=current_log_level().upper(), format="%(asctime)s %(levelname)s [engine] %(message)s")
    context = zmq.Context()
    requests, outputs = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    requests.connect(options.requests)
    outputs.connect(options.outputs)
    outputs.setsockopt(zmq.LINGER, 5000)
    core = None
    loaded = False
    try:
        from tokenmill.config import EngineArgs
        from tokenmill.engine_core.config_resolver import resolve_config
        from tokenmill.engine_core.core_builder import build_engine_core

        config = resolve_config(EngineArgs.from_kwargs(**json.loads(sys.stdin.read())))
        logger.info("engine configuration:\n%s", config.render_report())
        core = build_engine_core(config, defer_graph_capture=True)
        outputs.send_multipart(wire.frame(wire.READY, ready_message(config, core.runner.model,
                                                                    core.scheduler.config.num_blocks)))
        loaded = True
        EngineCoreProc(core, config, requests, outputs).run()
        return 0
    except Exception as error:  # reported to the front end, which turns it into 503s and an exit
        if loaded or tracebacks_wanted():  # a failed start is the front end's one line (a bad model, mostly)
            logger.exception("engine core failed")
        outputs.send_multipart(wire.frame(wire.DEAD, EngineCoreFailure(failure_summary(error))))
        return 1
    finally:
        if core is not None:
            core.shutdown()
        requests.close(linger=0)
        outputs.close()
        context.term()


if __name__ == "__main__":
    sys.exit(main())
