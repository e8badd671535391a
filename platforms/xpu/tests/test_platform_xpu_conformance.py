"""The testkit's platform suite: static checks here, device checks on a machine with an Intel GPU."""

from tokenmill_testkit import PlatformConformance
from tokenmill_xpu.platform import XpuPlatform


class TestXpuPlatformConformance(PlatformConformance):
    platform_cls = XpuPlatform
