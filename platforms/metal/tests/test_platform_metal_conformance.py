"""The testkit's platform suite: static checks here, device checks on a Mac."""

from tokenmill_metal.platform import MetalPlatform
from tokenmill_testkit import PlatformConformance


class TestMetalPlatformConformance(PlatformConformance):
    platform_cls = MetalPlatform
