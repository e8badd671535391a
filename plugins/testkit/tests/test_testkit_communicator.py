"""The communicator suite: core's default communicator (a platform's when it supplies none) passes it,
deliberately broken ones fail it (with the reason), and a rank that hangs fails the run at its deadline
instead of hanging it."""

from __future__ import annotations

import pytest
import torch  # noqa: F401

# Imported here so the in-process pytester run below finds them already loaded (pytester restores
# sys.modules afterwards, and torch cannot be imported twice).
import tokenmill_testkit.communicator_conformance  # noqa: F401
from tokenmill.plugin_api import Platform, PlatformCapabilities, ProbeResult
from tokenmill_testkit import CommunicatorConformance

pytest_plugins = ["pytester"]
ARGS = ("-p", "no:cacheprovider", "--import-mode=importlib", "-q", "-rfs")


class HostPlatform(Platform):
    """A platform that keeps every default: its communicator is core's TorchDistributedCommunicator
    over a new gloo group."""

    name = "host"
    device_type = "cpu"

    @classmethod
    def probe(cls) -> ProbeResult:
        return ProbeResult(10, ("always here",))

    @property
    def capabilities(self) -> PlatformCapabilities:
        return PlatformCapabilities(collectives=("gloo",))


class TestDefaultCommunicator(CommunicatorConformance):
    platform_cls = HostPlatform

    def test_the_default_is_torch_distributed(self, ranks) -> None:
        for report in self.reports(ranks):
            assert report["meta"]["describe"].startswith("torch.distributed gloo, rank"), report["meta"]


BROKEN = '''
import time
from tokenmill.plugin_api import TorchDistributedCommunicator
from tokenmill_testkit import CommunicatorConformance


class Careless(TorchDistributedCommunicator):
    """Three classic bugs: a sum that never leaves the rank, a gather in reverse rank order and a
    barrier that waits for nobody."""

    def all_reduce(self, tensor):
        return tensor.contiguous()

    def all_gather(self, tensor, dim=0):
        gathered = super().all_gather(tensor, dim)
        return gathered.flip(dim).contiguous() if gathered.shape[dim] > 1 else gathered

    def barrier(self):
        pass


class Stuck(TorchDistributedCommunicator):
    """A receive that never returns."""

    def recv(self, out, src):
        time.sleep(3600)


def careless():
    return Careless.create("gloo")


def stuck():
    return Stuck.create("gloo")


class TestCareless(CommunicatorConformance):
    communicator_factory = careless


class TestStuck(CommunicatorConformance):
    communicator_factory = stuck
    timeout_s = 60.0
'''


def _failed_tests(result: pytest.RunResult) -> set[str]:
    return {line.split("::", 1)[1].split(" ")[0] for line in result.outlines if line.startswith("FAILED ")}


@pytest.mark.live
def test_communicator_suite_catches_broken_communicators(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_communicators=BROKEN)
    result = pytester.runpytest(*ARGS)
    failed = _failed_tests(result)
    careless = {name.split("::")[1] for name in failed if name.startswith("TestCareless::")}
    assert careless == {"test_all_reduce", "test_reductions_are_bit_identical_on_every_rank", "test_all_gather",
                        "test_barrier_waits_for_every_rank"}, failed
    stuck = {name for name in failed if name.startswith("TestStuck::")}
    assert len(stuck) == 11, failed  # every test of the class: the run never finished
    result.stdout.fnmatch_lines(["*was killed (timeout or another rank failed)*", "*case send_recv_float32*"])
