"""The testkit's platform suite: static checks here, device checks on a machine with a GPU."""

from tokenmill_cuda.platform import CudaPlatform
from tokenmill_testkit import PlatformConformance


class TestCudaPlatformConformance(PlatformConformance):
    platform_cls = CudaPlatform
