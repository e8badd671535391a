"""The testkit's API-version checks, run with pytester: each suite fails a plugin class that declares
no ``api_version`` itself (an inherited one does not count), one that needs a newer minor than core
provides, and one built for another major; and passes one that declares core's version."""

from __future__ import annotations

import pytest

from tokenmill.plugin_api import PLUGIN_API_VERSION, Quantizer, api_version_problem

pytest_plugins = ["pytester"]
ARGS = ("-p", "no:cacheprovider", "--import-mode=importlib", "-q", "-rf", "-k", "api_version")
MAJOR, MINOR = PLUGIN_API_VERSION
VERSIONS = {"Declared": PLUGIN_API_VERSION, "NewerMinor": (MAJOR, MINOR + 1), "OtherMajor": (MAJOR - 1, 7)}

SUITES = '''
import torch
from tokenmill.plugin_api import (AttentionBackend, AttentionCapabilities, Platform, PlatformCapabilities,
                                  ProbeResult, Quantizer, QuantKernel)
from tokenmill_testkit import AttentionBackendConformance, PlatformConformance, QuantizerConformance

VERSION = {version!r}

class Host(Platform):
    name = "host"
    device_type = "cpu"
    api_version = VERSION

    @classmethod
    def probe(cls):
        return ProbeResult(10, ("always here",))

    @property
    def capabilities(self):
        return PlatformCapabilities()

class Backend(AttentionBackend):
    name = "backend"
    api_version = VERSION
    capabilities = AttentionCapabilities(device_types=("cpu",), dtypes=("float32",))

class Plain(QuantKernel):
    name = "plain"

    def apply(self, layer, x, bias):
        return torch.nn.functional.linear(x, layer.weight, bias)

class Format(Quantizer):
    name = "format"
    api_version = VERSION

    @classmethod
    def detect(cls, hf_config, model_path):
        return 0.0

    def kernels(self):
        return (Plain,)
'''

CASE = '''
class {label}{base}({base}):
{declaration}
class Test{label}{base}({suite}):
    {attribute} = {label}{base}
'''
KINDS = (("Host", "PlatformConformance", "platform_cls"), ("Backend", "AttentionBackendConformance", "backend_cls"),
         ("Format", "QuantizerConformance", "quantizer_cls"))


def _suite_file() -> str:
    cases = [SUITES.replace("{version!r}", repr(PLUGIN_API_VERSION))]
    for base, suite, attribute in KINDS:
        cases.append(CASE.format(label="Undeclared", base=base, suite=suite, attribute=attribute,
                                 declaration="    pass"))  # inherits the base's compatible version only
        for label, version in VERSIONS.items():
            cases.append(CASE.format(label=label, base=base, suite=suite, attribute=attribute,
                                     declaration=f"    api_version = {version!r}"))
    return "\n".join(cases)


@pytest.mark.live  # its own pytest process: an in-process run's sys.modules restore would import torch twice
def test_every_suite_fails_an_undeclared_or_incompatible_api_version(pytester):
    pytester.makepyfile(test_versions=_suite_file())
    result = pytester.runpytest_subprocess(*ARGS)
    failed = {line.split(" ")[1].split("::", 1)[1].split("::")[0]
              for line in result.outlines if line.startswith("FAILED ")}
    assert failed == {f"Test{label}{base}" for base, _, _ in KINDS for label in ("Undeclared", "NewerMinor", "OtherMajor")}
    assert result.parseoutcomes()["passed"] == len(KINDS)  # the Declared classes
    result.stdout.fnmatch_lines([f"*UndeclaredHost declares no api_version: set api_version = ({MAJOR}, {MINOR}) in its class body*",
                                 f"*NewerMinorBackend declares plugin API {MAJOR}.{MINOR + 1}, which this tokenmill "
                                 f"({MAJOR}.{MINOR}) cannot load*"])


def test_an_inherited_api_version_does_not_count():
    class Declared(Quantizer):
        name = "declared"
        api_version = PLUGIN_API_VERSION

    class Inherits(Declared):
        name = "inherits"

    assert api_version_problem(Declared) is None
    assert api_version_problem(Inherits).startswith("declares no api_version")
    assert api_version_problem(type("Flagged", (Declared,), {"api_version": (True, 0)})) \
        == "declares api_version (True, 0); expected a (major, minor) tuple of integers"
