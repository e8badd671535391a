"""The testkit's platform suite: static checks here, device checks on a machine with an AMD GPU."""

from tokenmill_rocm.platform import RocmPlatform
from tokenmill_testkit import PlatformConformance


class TestRocmPlatformConformance(PlatformConformance):
    platform_cls = RocmPlatform
