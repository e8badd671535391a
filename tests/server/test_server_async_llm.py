"""AsyncLLM and the engine-core process without HTTP, on a tiny random-weight model: outputs,
aborts, stats, admission, engine death and startup failure."""

import asyncio
import os

import pytest
from server_live import build_tiny_model

from tokenmill.config import EngineArgs
from tokenmill.frontend.async_llm import AsyncLLM, EngineDeadError, QueueFullError
from tokenmill.frontend.core_client import EngineCoreClient
from tokenmill.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("async-llm") / "tiny"))


def run(model, scenario, **kwargs):
    async def main():
        engine = await AsyncLLM.from_engine_args(EngineArgs(model=model, kv_cache_memory="32MiB", max_num_seqs=4),
                                                 **kwargs)
        try:
            return await scenario(engine)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def greedy(max_tokens, **extra):
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **extra)


def test_outputs_stats_and_ready_summary(model):
    async def scenario(engine):
        assert engine.ready.max_model_len == 512 and engine.ready.served_model_name == "tiny"
        stats = []
        engine.add_stats_listener(stats.append)
        ids = await engine.encode("Hello there")
        final = [o async for o in engine.generate("a", ids, greedy(5))]
        deltas = [o async for o in engine.generate("b", ids, greedy(5, n=2, output_kind=RequestOutputKind.DELTA))]
        return final, deltas, stats

    final, deltas, stats = run(model, scenario)
    assert len(final[-1].outputs[0].token_ids) == 5 and final[-1].finished
    joined = {0: [], 1: []}
    for output in deltas:
        for completion in output.outputs:
            joined[completion.index] += completion.token_ids
    assert joined[0] == joined[1] == final[-1].outputs[0].token_ids  # greedy: both samples equal the first run
    assert sum(s.num_generation_tokens for s in stats) == 15
    assert [f.finish_reason for s in stats for f in s.finished] == ["length", "length"]
    assert len([t for s in stats for t in s.time_to_first_token]) == 2
    assert stats[-1].scheduler.num_running == 0


def test_closing_the_iterator_aborts_and_frees(model):
    async def scenario(engine):
        ids = await engine.encode("Hello")
        stream = engine.add_request("long", ids, greedy(400, n=3, output_kind=RequestOutputKind.DELTA))
        await stream.__anext__()
        await stream.aclose()
        assert engine.num_unfinished_requests == 0
        for _ in range(100):
            await asyncio.sleep(0.02)
            stats = engine.last_scheduler_stats
            if stats.num_running == 0 and stats.kv_cache_usage == 0:
                return True
        return False

    assert run(model, scenario)


def test_a_never_started_iterator_is_released_by_abort(model):
    async def scenario(engine):
        ids = await engine.encode("Hello")
        engine.add_request("orphan", ids, greedy(400))
        engine.abort("orphan")
        return engine.num_unfinished_requests

    assert run(model, scenario) == 0


def test_admission_counts_sequences(model):
    async def scenario(engine):
        ids = await engine.encode("Hello")
        streams = [engine.add_request(f"r{i}", ids, greedy(300, n=2)) for i in range(3)]  # 6 of 4 + 2
        with pytest.raises(QueueFullError):
            engine.add_request("over", ids, greedy(3))
        for stream in streams:
            await stream.aclose()
        engine.abort_all("test over")
        return engine.num_unfinished_requests

    assert run(model, scenario, max_waiting_requests=2) == 0


def test_engine_death_fails_waiting_requests(model):
    async def scenario(engine):
        ids = await engine.encode("Hello")
        deaths = []
        engine.on_death(deaths.append)
        stream = engine.add_request("victim", ids, greedy(400, output_kind=RequestOutputKind.DELTA))
        await stream.__anext__()
        engine.client.process.kill()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            engine.add_request("after", ids, greedy(2))
        return engine.is_dead, deaths

    dead, deaths = run(model, scenario)
    assert dead and len(deaths) == 1


def test_socket_directory_is_private_and_removed(model):
    async def scenario(engine):
        directory = engine.client.socket_dir
        mode = os.stat(directory).st_mode & 0o777
        return directory, mode

    directory, mode = run(model, scenario)
    assert mode == 0o700 and not os.path.exists(directory)


def test_startup_failure_is_reported(tmp_path):
    async def main():
        client = await EngineCoreClient.start(EngineArgs(model=str(tmp_path / "missing")))
        try:
            await client.wait_ready(120)
        finally:
            client.shutdown()

    with pytest.raises(EngineDeadError, match="failed to start"):
        asyncio.run(main())
