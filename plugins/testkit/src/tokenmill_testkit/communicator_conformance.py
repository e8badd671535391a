"""CommunicatorConformance: a platform's communicator checked against the ``Communicator`` contract
by real ranks, each its own Python process.

Subclass it in a test file and name either the platform (its ``create_communicator`` is tested) or a
function returning the communicator (module level, called in each rank once ``torch.distributed`` is
initialised, over gloo)::

    class TestMyCommunicator(CommunicatorConformance):
        platform_cls = MyPlatform

    def shared_memory_communicator():
        return MyCommunicator.attach(TorchDistributedCommunicator.create("gloo"))

    class TestMySharedMemory(CommunicatorConformance):
        communicator_factory = shared_memory_communicator

The ranks (``world_size``, 2 by default) run every case of ``communicator_cases`` once per test class;
each test then checks one operation's results against single-process math: odd and large shapes,
bfloat16, float16 and int64, non-contiguous inputs, uneven all-to-all splits, send/recv both ways.
A rank that fails or hangs (past ``timeout_s``) fails every test with its traceback or log. The tests
carry the ``live`` marker: they start Python processes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from tokenmill.plugin_api import Communicator, Platform
from tokenmill_testkit.communicator_cases import CommunicatorCase, cases, expected
from tokenmill_testkit.communicator_world import RankRun, run_world


def _spec(obj: Any) -> str:
    """``module:qualname@file``, what the rank processes import ``obj`` from."""
    return f"{obj.__module__}:{obj.__qualname__}@{inspect.getfile(obj)}"


class CommunicatorConformance:
    """Base class of a communicator's conformance tests; set ``platform_cls`` or ``communicator_factory``."""

    pytestmark = [pytest.mark.live]

    platform_cls: ClassVar[type[Platform] | None] = None
    communicator_factory: ClassVar[Callable[[], Communicator] | None] = None
    world_size: ClassVar[int] = 2
    timeout_s: ClassVar[float] = 240.0  # the whole run: process start-up, every case, shutdown
    op_timeout_s: ClassVar[float] = 60.0  # one torch.distributed operation

    @pytest.fixture(scope="class")
    @classmethod
    def ranks(cls, tmp_path_factory: pytest.TempPathFactory) -> list[RankRun]:
        """Every rank's run (started once for the class)."""
        factory = cls.communicator_factory  # a plain function through the class, never bound
        if factory is not None:
            target = ["--factory", _spec(factory)]
        elif cls.platform_cls is not None:
            probe = cls.platform_cls.probe()
            if not probe.available:
                pytest.skip(f"{cls.platform_cls.name} is not available here: {'; '.join(probe.reasons)}")
            target = ["--platform", _spec(cls.platform_cls)]
        else:
            raise TypeError(f"{cls.__name__} sets neither platform_cls nor communicator_factory")
        return run_world(target, cls.world_size, cls.timeout_s, tmp_path_factory.mktemp("communicator"),
                         cls.op_timeout_s)

    # -- helpers --------------------------------------------------------------------------------

    def reports(self, ranks: list[RankRun]) -> list[dict[str, Any]]:
        """Every rank's report; fails the test with each failed rank's story if any rank failed."""
        failed = [run for run in ranks if run.returncode != 0 or run.report is None or run.report.get("error")]
        if failed:
            pytest.fail("the communicator's ranks did not all finish:\n\n" + "\n\n".join(r.summary() for r in failed),
                        pytrace=False)
        return [run.report for run in ranks]

    def check_operation(self, ranks: list[RankRun], operation: str) -> None:
        """Every case of ``operation``, on every rank, against its single-process result."""
        reports = self.reports(ranks)
        checked = [case for case in cases(self.world_size) if case.operation == operation]
        assert checked, operation
        for case in checked:
            for rank, report in enumerate(reports):
                self.check_result(case, rank, report["results"][case.name])

    def check_result(self, case: CommunicatorCase, rank: int, actual: Any) -> None:
        """One rank's result of one case: equal for data movement, close (per dtype) for sums."""
        want = expected(case, rank, self.world_size)
        pairs = list(zip(actual, want, strict=True)) if isinstance(want, list) else [(actual, want)]
        assert len(pairs) == (len(want) if isinstance(want, list) else 1), f"{case.name}: rank {rank} result count"
        tolerance = case.tolerance()
        for index, (got, reference) in enumerate(pairs):
            what = f"{case.name} on rank {rank}" + (f", item {index}" if isinstance(want, list) else "")
            assert got.shape == reference.shape and got.dtype == reference.dtype, \
                f"{what}: got {tuple(got.shape)} {got.dtype}, want {tuple(reference.shape)} {reference.dtype}"
            if tolerance is None:
                assert torch.equal(got, reference), f"{what}: values differ from the single-process result"
            else:
                torch.testing.assert_close(got.float(), reference.float(), atol=tolerance[0], rtol=tolerance[1],
                                           msg=lambda detail, what=what: f"{what}: {detail}")

    # -- the tests ------------------------------------------------------------------------------

    def test_ranks_and_world_size(self, ranks: list[RankRun]) -> None:
        metas = [report["meta"] for report in self.reports(ranks)]
        assert sorted(meta["rank"] for meta in metas) == list(range(self.world_size)), metas
        assert all(meta["world_size"] == self.world_size for meta in metas), metas
        for meta in metas:
            assert isinstance(meta["describe"], str) and meta["describe"] and "\n" not in meta["describe"], meta

    def test_all_reduce(self, ranks: list[RankRun]) -> None:
        """float32, bfloat16, float16 and int64; one element, odd, transposed and 4 MiB+ tensors;
        40 calls in a row."""
        self.check_operation(ranks, "all_reduce")

    def test_reductions_are_bit_identical_on_every_rank(self, ranks: list[RankRun]) -> None:
        reports = self.reports(ranks)
        for case in cases(self.world_size):
            if case.operation != "all_reduce":
                continue
            first = reports[0]["results"][case.name]
            for rank, report in enumerate(reports[1:], start=1):
                other = report["results"][case.name]
                same = all(map(torch.equal, first, other)) if isinstance(first, list) else torch.equal(first, other)
                assert same, f"{case.name}: rank {rank}'s sum differs from rank 0's in some bits"

    def test_all_gather(self, ranks: list[RankRun]) -> None:
        self.check_operation(ranks, "all_gather")

    def test_reduce_scatter(self, ranks: list[RankRun]) -> None:
        self.check_operation(ranks, "reduce_scatter")

    def test_broadcast(self, ranks: list[RankRun]) -> None:
        self.check_operation(ranks, "broadcast")

    def test_all_to_all(self, ranks: list[RankRun]) -> None:
        """Equal pieces and uneven split sizes."""
        self.check_operation(ranks, "all_to_all")

    def test_send_recv(self, ranks: list[RankRun]) -> None:
        """Each pair of ranks both ways, several messages arriving in order."""
        self.check_operation(ranks, "send_recv")

    def test_results_keep_the_contract(self, ranks: list[RankRun]) -> None:
        """Contiguous results of the input's dtype, inputs unchanged, broadcast in place."""
        problems = [f"rank {rank}, {name}: {problem}" for rank, report in enumerate(self.reports(ranks))
                    for name, found in report["problems"].items() for problem in found]
        assert not problems, "\n".join(problems)

    def test_barrier_waits_for_every_rank(self, ranks: list[RankRun]) -> None:
        """The last rank enters ``BARRIER_DELAY_S`` late; no rank may leave before it entered."""
        times = [report["barrier"] for report in self.reports(ranks)]
        last_entered = max(t["entered"] for t in times)
        assert all(t["left"] >= last_entered for t in times), f"a rank left the barrier early: {times}"

    def test_destroy_is_idempotent(self, ranks: list[RankRun]) -> None:
        errors = [report["destroy_error"] for report in self.reports(ranks) if report["destroy_error"]]
        assert not errors, "destroy() raised (it was called twice):\n" + "\n".join(errors)
