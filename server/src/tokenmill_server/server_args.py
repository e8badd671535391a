"""ServerSettings: the HTTP server's own flags (address, keys, limits, lifecycle), apart from the
engine's. API keys come from repeated or comma-separated --api-key and from TOKENMILL_API_KEY."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from tokenmill.config import parse_size
from tokenmill_server.sampling import RequestLimits
from tokenmill_server.tool_parsers import PARSERS

API_KEY_ENV = "TOKENMILL_API_KEY"


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server needs apart from the engine."""

    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int | None = None
    api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False
    allowed_origins: tuple[str, ...] = ("*",)
    max_body_bytes: int = 32 << 20
    max_n: int = 64
    max_stop_sequences: int = 16
    max_stop_length: int = 1024
    max_logit_bias: int = 1024
    max_prompts: int = 64
    max_embedding_inputs: int = 2048
    max_tools: int = 128
    max_waiting_requests: int | None = 1024
    max_connections: int | None = None  # None: from the open-file limit (connection_cap.default_max_connections)
    max_stream_buffer_bytes: int = 1 << 20
    request_read_timeout: float = 30.0
    write_timeout: float = 60.0
    socket_send_buffer: int = 0
    trust_request_chat_template: bool = False
    request_chat_template_timeout: float = 5.0
    request_chat_template_max_chars: int = 2_000_000
    allow_special_tokens_in_content: bool = False
    tool_call_parser: str | None = None  # set: tool_choice "auto" reads calls from the output with it
    shutdown_timeout: float = 0.0
    keep_alive_on_engine_death: bool = False
    log_interval: float = 5.0
    ready_timeout: float | None = None
    uvicorn_log_level: str = "warning"

    def request_limits(self) -> RequestLimits:
        return RequestLimits(max_n=self.max_n, max_stop_sequences=self.max_stop_sequences,
                             max_stop_length=self.max_stop_length, max_logit_bias=self.max_logit_bias,
                             max_prompts=self.max_prompts, max_embedding_inputs=self.max_embedding_inputs,
                             max_tools=self.max_tools, tool_call_parser=self.tool_call_parser,
                             trust_request_chat_template=self.trust_request_chat_template)


def api_keys(flags: list[str] | None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every key from the flags and the environment, split on commas, blanks dropped, in order."""
    environ = os.environ if environ is None else environ
    values = list(flags or []) + [environ.get(API_KEY_ENV, "")]
    keys = [key.strip() for value in values for key in value.split(",")]
    return tuple(dict.fromkeys(key for key in keys if key))


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000)")
    group.add_argument("--grpc-port", type=int, default=None, help="also serve the gRPC API on this port")
    group.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help=f"require this key (repeat or comma-separate for several; also ${API_KEY_ENV})")
    group.add_argument("--protect-metrics", action="store_true", help="require the API key on /metrics too")
    group.add_argument("--allowed-origins", default="*", help="CORS origins, comma-separated ('' for none)")
    group.add_argument("--max-body-size", default="32MiB", help="largest request body (default: 32MiB)")
    group.add_argument("--max-n", type=int, default=64, help="largest n / best_of per request (default: 64)")
    group.add_argument("--max-stop-sequences", type=int, default=16, help="most stop strings (default: 16)")
    group.add_argument("--max-stop-length", type=int, default=1024, help="longest stop string (default: 1024)")
    group.add_argument("--max-logit-bias", type=int, default=1024, help="most logit_bias entries (default: 1024)")
    group.add_argument("--max-prompts-per-request", type=int, default=64,
                       help="most prompts in one completions request (default: 64)")
    group.add_argument("--max-embedding-inputs", type=int, default=2048,
                       help="most inputs in one /v1/embeddings request (default: 2048, as OpenAI)")
    group.add_argument("--max-tools", type=int, default=128, help="most tools in one request (default: 128)")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="let the model decide to call tools (tool_choice 'auto'); needs --tool-call-parser")
    group.add_argument("--tool-call-parser", choices=sorted(PARSERS), default=None,
                       help="the model family's tool-call syntax, read from its output for tool_choice 'auto'")
    group.add_argument("--max-waiting-requests", type=int, default=1024,
                       help="sequences allowed to wait beyond --max-num-seqs before new requests get 503 "
                            "(default: 1024; -1: unbounded)")
    group.add_argument("--max-connections", type=int, default=None,
                       help="HTTP connections open at once; at the cap a new one replaces the longest-idle one "
                            "(default: from the open-file limit, RLIMIT_NOFILE, less headroom)")
    group.add_argument("--max-stream-buffer", default="1MiB",
                       help="unsent output one stream may hold before a slow reader's request is stopped "
                            "(default: 1MiB)")
    group.add_argument("--request-read-timeout", type=float, default=30.0,
                       help="seconds a client has to send a whole request, headers and body, before the "
                            "connection gets a 408 and is closed (default: 30; 0: off)")
    group.add_argument("--write-timeout", type=float, default=60.0,
                       help="seconds a response may wait for a client that reads nothing before the connection "
                            "is closed (default: 60; 0: off)")
    group.add_argument("--socket-send-buffer", default="0",
                       help="cap each connection's kernel send buffer (SO_SNDBUF), e.g. 64KiB (default: 0, "
                            "the kernel's autotuning)")
    group.add_argument("--trust-request-chat-template", action="store_true",
                       help="let requests supply their own chat template (unsafe with untrusted clients); it "
                            "renders in a bounded sandbox on threads of its own")
    group.add_argument("--request-chat-template-timeout", type=float, default=5.0,
                       help="seconds a request's chat template may render before the request gets a 400 "
                            "(default: 5)")
    group.add_argument("--request-chat-template-max-chars", type=int, default=2_000_000,
                       help="longest text (and value on the way) a request's chat template may make "
                            "(default: 2000000)")
    group.add_argument("--allow-special-tokens-in-content", action="store_true",
                       help="let special-token strings in chat messages (e.g. '<|im_end|>') become control tokens, "
                            "as in vLLM; by default they are tokenized as text, so a message cannot forge a turn")
    group.add_argument("--shutdown-timeout", type=float, default=0.0,
                       help="on SIGTERM, seconds to let running requests finish before aborting them (default: 0)")
    group.add_argument("--keep-alive-on-engine-death", action="store_true",
                       help="keep serving 503s after the engine dies instead of exiting")
    group.add_argument("--log-interval", type=float, default=5.0,
                       help="seconds between throughput log lines while busy (default: 5; 0: off)")
    group.add_argument("--ready-timeout", type=float, default=None, help="give up if the model is not loaded in time")
    group.add_argument("--uvicorn-log-level", default="warning", help="uvicorn's log level (default: warning)")


def settings_from(namespace: argparse.Namespace) -> ServerSettings:
    """ServerSettings from parsed flags; ValueError for flags that do not go together."""
    if namespace.enable_auto_tool_choice and namespace.tool_call_parser is None:
        raise ValueError(f"--enable-auto-tool-choice needs --tool-call-parser (one of {', '.join(sorted(PARSERS))})")
    origins = tuple(o.strip() for o in namespace.allowed_origins.split(",") if o.strip())
    waiting = namespace.max_waiting_requests
    return ServerSettings(
        host=namespace.host, port=namespace.port, grpc_port=namespace.grpc_port, api_keys=api_keys(namespace.api_key),
        protect_metrics=namespace.protect_metrics, allowed_origins=origins,
        max_body_bytes=parse_size(namespace.max_body_size), max_n=namespace.max_n,
        max_stop_sequences=namespace.max_stop_sequences, max_stop_length=namespace.max_stop_length,
        max_logit_bias=namespace.max_logit_bias, max_prompts=namespace.max_prompts_per_request,
        max_embedding_inputs=namespace.max_embedding_inputs,
        max_tools=namespace.max_tools, max_waiting_requests=None if waiting is not None and waiting < 0 else waiting,
        max_connections=_positive_or_none(namespace.max_connections, "--max-connections"),
        max_stream_buffer_bytes=parse_size(namespace.max_stream_buffer),
        request_read_timeout=namespace.request_read_timeout, write_timeout=namespace.write_timeout,
        socket_send_buffer=parse_size(namespace.socket_send_buffer),
        trust_request_chat_template=namespace.trust_request_chat_template,
        request_chat_template_timeout=namespace.request_chat_template_timeout,
        request_chat_template_max_chars=namespace.request_chat_template_max_chars,
        allow_special_tokens_in_content=namespace.allow_special_tokens_in_content,
        tool_call_parser=namespace.tool_call_parser if namespace.enable_auto_tool_choice else None,
        shutdown_timeout=namespace.shutdown_timeout, keep_alive_on_engine_death=namespace.keep_alive_on_engine_death,
        log_interval=namespace.log_interval, ready_timeout=namespace.ready_timeout,
        uvicorn_log_level=namespace.uvicorn_log_level)


def _positive_or_none(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")
    return value
