"""StructuredOutputCompiler: StructuredOutputsParams -> a RequestGrammar over the model's vocabulary.

The engine core keeps no tokenizer for anything else; this loads the vocabulary from the tokenizer
files the first time a request asks for structured output, and compiles each distinct constraint once
(xgrammar's compiler caches compiled grammars)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from tokenmill.structured.params import StructuredOutputsParams, grammar_error, structural_tag_arguments
from tokenmill.structured.request_grammar import RequestGrammar

logger = logging.getLogger("tokenmill")


class StructuredOutputCompiler:
    """Compiles the constraints of one model's requests; built from its tokenizer path and vocabulary size."""

    def __init__(self, tokenizer_path: str | None, vocab_size: int, eos_token_ids: Iterable[int] = (),
                 max_threads: int = 2) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.max_threads = max_threads
        self._compiler: Any = None

    def _xgrammar_compiler(self) -> Any:
        if self._compiler is None:
            if not self.tokenizer_path:
                raise ValueError("structured outputs need the model's tokenizer, and this engine has none.")
            import xgrammar

            from tokenmill.tokenizer.loader import load_tokenizer

            started = time.perf_counter()
            info = xgrammar.TokenizerInfo.from_huggingface(load_tokenizer(self.tokenizer_path),
                                                           vocab_size=self.vocab_size,
                                                           stop_token_ids=self.eos_token_ids or None)
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=self.max_threads)
            logger.info("structured outputs: loaded the vocabulary for grammars in %.2f s",
                        time.perf_counter() - started)
        return self._compiler

    def grammar(self, params: StructuredOutputsParams, stop_token_ids: Iterable[int]) -> RequestGrammar:
        """A fresh matcher for one request; ValueError when the constraint does not compile."""
        compiler = self._xgrammar_compiler()
        kind, text = params.key()
        try:
            if kind == "json":
                compiled = compiler.compile_json_schema(text, any_whitespace=not params.disable_any_whitespace)
            elif kind == "json_object":
                compiled = compiler.compile_builtin_json_grammar()
            elif kind == "regex":
                compiled = compiler.compile_regex(text)
            elif kind == "structural_tag":
                compiled = compiler.compile_structural_tag(*structural_tag_arguments(text))
            else:
                compiled = compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as error:
            raise ValueError(f"structured outputs: invalid {params.kind}: {grammar_error(error)}") from None
        return RequestGrammar(compiled, sorted(set(stop_token_ids)))
