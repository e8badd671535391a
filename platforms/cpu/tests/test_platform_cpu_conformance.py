"""The testkit's platform suite, all of it: the CPU platform is available everywhere."""

from tokenmill_cpu.platform import CpuPlatform
from tokenmill_testkit import PlatformConformance


class TestCpuPlatformConformance(PlatformConformance):
    platform_cls = CpuPlatform
