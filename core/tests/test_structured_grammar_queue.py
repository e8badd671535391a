"""Grammars compile off the engine loop: while one compiles, the engine keeps stepping the other
requests; constrained requests start in arrival order once compiled; aborting one that is still
compiling ends it at once; a constraint that fails to compile aborts its request only."""

import threading

import pytest
from hf_parity import save_bracketed_llama

from tokenmill import LLM, SamplingParams
from tokenmill.structured.grammar_compiler import StructuredOutputCompiler
from tokenmill.structured.grammar_queue import GrammarQueue
from tokenmill.wire import EngineCoreRequest

EOS = 2


class GatedCompiler(StructuredOutputCompiler):
    """The real compiler, held back until ``gate`` opens (to catch the engine mid-compilation)."""

    def __init__(self, inner: StructuredOutputCompiler) -> None:
        super().__init__(inner.tokenizer_path, inner.vocab_size, inner.eos_token_ids)
        self.gate = threading.Event()

    def grammar(self, params, stop_token_ids):
        assert self.gate.wait(30)
        return super().grammar(params, stop_token_ids)


@pytest.fixture()
def core(tmp_path):
    llm = LLM(save_bracketed_llama(tmp_path / "tiny"), kv_cache_memory="16MiB")
    core = llm.engine.core
    core._grammar_queue = GrammarQueue(GatedCompiler(core._grammar_queue.compiler))
    yield core
    core._grammar_queue.compiler.gate.set()


def request(request_id, prompt, **params):
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 6, **params})
    return EngineCoreRequest(request_id, prompt, params, eos_token_ids=[EOS])


def run(core, steps=40):
    tokens, finished = {}, {}
    for _ in range(steps):
        for output in core.step().outputs:
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.finish_reason is not None:
                finished[output.request_id] = output.finish_reason
    return tokens, finished


def test_others_run_while_a_grammar_compiles_then_it_runs(core):
    core.add_request(request("constrained", [5, 6], structured_outputs={"choice": ["<40><41>"]}))
    core.add_request(request("plain", [7, 8], ignore_eos=True))
    tokens, finished = run(core, steps=10)
    assert finished == {"plain": "length"} and len(tokens["plain"]) == 6 and "constrained" not in tokens
    assert core.has_unfinished_requests()  # the constrained one is still compiling
    core._grammar_queue.compiler.gate.set()
    tokens, finished = run(core)
    assert tokens["constrained"] == [40, 41, EOS] and finished == {"constrained": "stop"}
    assert not core.has_unfinished_requests()


def test_abort_while_compiling(core):
    core.add_request(request("gone", [5], structured_outputs={"regex": "<9>"}))
    core.add_request(request("kept", [5], structured_outputs={"regex": "<8>"}))
    core.abort_requests(["gone"])
    tokens, finished = run(core, steps=2)
    assert finished == {"gone": "abort"} and tokens["gone"] == []
    core._grammar_queue.compiler.gate.set()
    tokens, finished = run(core)
    assert finished == {"kept": "stop"} and tokens["kept"] == [8, EOS]


def test_a_constraint_that_fails_to_compile_aborts_only_its_request(core):
    core._grammar_queue.compiler.gate.set()
    bad = request("bad", [5], structured_outputs={"regex": "<1>"})
    bad.sampling_params.structured_outputs.regex = "a("  # past the front end's check
    core.add_request(bad)
    core.add_request(request("good", [5], structured_outputs={"choice": ["<3>"]}))
    tokens, finished = run(core)
    assert finished == {"bad": "abort", "good": "stop"} and tokens["good"] == [3, EOS]


def test_queue_keeps_arrival_order_and_drops_removed():
    class Slow:
        def __init__(self):
            self.gates = {}

        def grammar(self, params, stop_token_ids):
            self.gates[params.regex].wait(30)
            return params.regex

    class Request:
        def __init__(self, request_id):
            self.request_id = request_id
            self.sampling_params = SamplingParams(structured_outputs={"regex": request_id})
            self.eos_token_ids = frozenset([EOS])
            self.stop_token_ids = frozenset()

    compiler = Slow()
    queue = GrammarQueue(compiler)
    for name in ("a", "b", "c"):
        compiler.gates[name] = threading.Event()
        queue.submit(Request(name), None)
    compiler.gates["a"].set()
    first = queue.ready(wait_s=5)
    assert [(r.request_id, g) for r, _, g in first] == [("a", "a")]
    assert [r.request_id for r in queue.remove(["b"])] == ["b"] and len(queue) == 1
    compiler.gates["b"].set()
    compiler.gates["c"].set()
    assert [r.request_id for r, _, _ in queue.ready(wait_s=5)] == ["c"]
    queue.shutdown()
