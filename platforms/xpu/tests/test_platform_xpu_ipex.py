"""Intel Extension for PyTorch stays optional: never imported on a version mismatch, and an import
that raises (even SystemExit) is reported, not propagated."""

from __future__ import annotations

import sys

import torch

from tokenmill_xpu import ipex
from tokenmill_xpu.platform import XpuPlatform

TORCH_MAJOR_MINOR = ".".join(torch.__version__.split(".")[:2])
NEVER_IMPORT = "raise AssertionError('a mismatched IPEX must never be imported')\n"
EXITS = "import sys\nsys.exit('IPEX requires torch 2.8')\n"


def test_version_matching():
    assert ipex.major_minor("2.8.10+xpu") == (2, 8)
    assert ipex.major_minor("nonsense") is None
    assert ipex.matches_torch("2.13.0+xpu", "2.13.1+cpu")
    assert not ipex.matches_torch("2.8.10+xpu", "2.13.0")


def test_not_installed_means_nothing_to_say():
    assert ipex.installed_version() is None
    assert ipex.status(torch.__version__) is None
    assert ipex.load(torch.__version__) == (None, None)


def test_mismatched_ipex_is_reported_and_never_imported(simulated_ipex, simulated_xpu):
    simulated_ipex.install("2.8.10+xpu", NEVER_IMPORT)
    simulated_xpu.devices(1)
    result = XpuPlatform.probe()
    assert result.score == 100
    assert f"intel-extension-for-pytorch 2.8.10+xpu ignored: it is built for another torch than {torch.__version__}" \
        in result.reasons
    platform = XpuPlatform(0)
    platform.activate()
    assert platform.ipex is None and "ignored" in platform.ipex_note
    assert ipex.MODULE not in sys.modules


def test_matching_ipex_that_exits_on_import_is_contained(simulated_ipex, simulated_xpu):
    simulated_ipex.install(f"{TORCH_MAJOR_MINOR}.0+xpu", EXITS)
    simulated_xpu.devices(1)
    assert any("used as an optional accelerator" in reason for reason in XpuPlatform.probe().reasons)
    assert ipex.MODULE not in sys.modules  # the probe read metadata only
    platform = XpuPlatform(0)
    platform.activate()  # must not raise SystemExit
    assert platform.ipex is None
    assert "failed to import (SystemExit('IPEX requires torch 2.8'))" in platform.ipex_note
    assert platform.describe().endswith("using stock torch.xpu")


def test_matching_ipex_that_imports_is_used(simulated_ipex, simulated_xpu):
    simulated_ipex.install(f"{TORCH_MAJOR_MINOR}.10+xpu", "LOADED = True\n")
    simulated_xpu.devices(1)
    platform = XpuPlatform(0)
    platform.activate()
    assert platform.ipex is not None and platform.ipex.LOADED
    assert platform.ipex_note.endswith("loaded")
