"""FakeDevicePlatform: the platform half of the example plugin."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tokenmill.plugin_api import DeviceInfo, Platform, PlatformCapabilities, ProbeResult

ENV_VAR = "TOKENMILL_FAKEDEV"
SCORE = 80  # above the CPU platform (50), below real accelerators (100)


class FakeDevicePlatform(Platform):
    """A pretend accelerator that computes on the CPU; enabled by ``TOKENMILL_FAKEDEV=1``."""

    name = "fakedev"
    device_type = "cpu"  # the torch device its tensors live on
    api_version = (2, 0)

    @classmethod
    def probe(cls) -> ProbeResult:
        """Score 80 when ``TOKENMILL_FAKEDEV=1``, else 0 with the reason.

        Invariant for every probe: read, never write. No runtime initialisation, no changes to
        os.environ or sys.modules, no vendor imports -- the testkit checks all of this.
        """
        if os.environ.get(ENV_VAR) != "1":
            return ProbeResult(0, (f"the example fake device is off (set {ENV_VAR}=1 to enable it)",))
        device = DeviceInfo(index=0, name="fakedev0 (CPU tensors)")
        return ProbeResult(SCORE, (f"fake device enabled by {ENV_VAR}=1",), (device,))

    @property
    def capabilities(self) -> PlatformCapabilities:
        """The family tag "fakedev" is what lets our own attention backend validate here."""
        return PlatformCapabilities(dtypes=("float32", "bfloat16"), collectives=("gloo",), families=("fakedev",))

    def attention_preference(self) -> tuple[str, ...]:
        """Our backend first; the reference backend if ours rejects a layer."""
        return ("fakedev", "reference")

    def quant_kernel_preference(self) -> tuple[str, ...]:
        """Try our fast fakeint8 kernel before any other kernel a format offers."""
        return ("fakeint8-scaled-mm",)

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """float32 when the user left dtype on auto. Return overrides; never mutate ``config``."""
        if config.get("dtype") in (None, "auto"):
            return {"dtype": "float32"}
        return {}

    def describe(self) -> str:
        """One line for logs."""
        return "fakedev:0 (example device on CPU tensors)"
