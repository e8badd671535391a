"""The reference platform: always available, always last, plain CPU capabilities."""

import os
import sys

from tokenmill.discovery import PluginRegistry, select_platform
from tokenmill.reference.platform import ReferencePlatform


def test_probe_is_low_scored_and_side_effect_free():
    modules, environ = set(sys.modules), dict(os.environ)
    result = ReferencePlatform.probe()
    assert set(sys.modules) == modules and dict(os.environ) == environ
    assert result.score == 1 and result.available
    assert result.reasons == ("plain-PyTorch reference (path of last resort)",)
    assert [d.index for d in result.devices] == [0] and result.devices[0].name


def test_capabilities_and_preferences():
    platform = ReferencePlatform()
    caps = platform.capabilities
    assert caps.dtypes == ("float32", "bfloat16", "float16")
    assert platform.distributed_backend == "gloo"
    assert platform.attention_preference() == ("reference",)
    assert platform.quant_kernel_preference() == ()
    assert str(platform.torch_device()) == "cpu" and platform.describe().startswith("reference (cpu")


def test_registered_through_cores_own_entry_point():
    registry = PluginRegistry.make_test_instance()
    (record,) = registry.find("platform", "reference")
    assert record.obj is ReferencePlatform and record.is_core
    assert select_platform(registry).platform_cls is ReferencePlatform
