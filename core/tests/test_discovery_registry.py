"""Discovery: statuses of loaded plugins (shape checks, API versions, probes, duplicates), lazy
loading, the allow/deny policy, and the installed core entries."""

import sys
from importlib.metadata import EntryPoint

from tokenmill.discovery import PluginPolicy, PluginRegistry, PluginStatus, discover
from tokenmill.plugin_api import (
    PLUGIN_API_VERSION,
    AttentionBackend,
    Platform,
    PlatformCapabilities,
    ProbeResult,
    Quantizer,
)


class GoodPlatform(Platform):
    name = "good"
    device_type = "cpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(10, ("fine",))

    @property
    def capabilities(self):
        return PlatformCapabilities()


class AbsentPlatform(GoodPlatform):
    name = "absent"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(0, ("no such device",))


class HalfPlatform(Platform):
    name = "half"
    device_type = "cpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(1)


class NamelessBackend(AttentionBackend):
    pass


class MissingLibraryBackend(AttentionBackend):
    name = "needs_lib"
    api_version = (2, 0)

    @classmethod
    def availability(cls):
        return "vendor_kernels is not installed"


class BadVersionQuantizer(Quantizer):
    name = "bad_version"
    api_version = "1.0"


def test_statuses_of_in_memory_plugins():
    registry = PluginRegistry.make_test_instance(
        platforms=[GoodPlatform, AbsentPlatform, HalfPlatform, ("notaclass", object())],
        attention_backends=[("nameless", NamelessBackend), MissingLibraryBackend],
        quantizers=[BadVersionQuantizer], include_core=False)
    status = {(r.kind, r.name): (r.status, r.reason) for r in registry.all_records()}
    assert status[("platform", "good")] == (PluginStatus.AVAILABLE, "fine")
    assert status[("platform", "absent")] == (PluginStatus.UNAVAILABLE, "no such device")
    assert status[("platform", "half")] == (PluginStatus.FAILED, "HalfPlatform does not implement capabilities")
    assert status[("platform", "notaclass")][0] is PluginStatus.FAILED
    assert "which is not a Platform subclass" in status[("platform", "notaclass")][1]
    assert status[("attention_backend", "nameless")] == (PluginStatus.FAILED, "NamelessBackend does not set name")
    assert status[("attention_backend", "needs_lib")] == (PluginStatus.UNAVAILABLE, "vendor_kernels is not installed")
    assert status[("quantizer", "bad_version")][0] is PluginStatus.FAILED
    assert "expected a (major, minor) tuple of integers" in status[("quantizer", "bad_version")][1]


def test_probe_results_are_kept_on_the_record():
    record = PluginRegistry.make_test_instance(platforms=[GoodPlatform], include_core=False).find("platform", "good")[0]
    assert record.probe == ProbeResult(10, ("fine",)) and record.api_version == PLUGIN_API_VERSION
    assert record.device_type == "cpu" and record.source == "in-memory-test"


def test_entry_point_import_failure_keeps_reason_and_traceback(tmp_path, monkeypatch):
    (tmp_path / "tm_test_bad_backend.py").write_text("import tm_test_vendor_runtime_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint("vendor", "tm_test_bad_backend:Backend", "tokenmill.attention_backends")
    record = PluginRegistry.make_test_instance(attention_backends=[ep], include_core=False).records("attention_backend")[0]
    assert record.status is PluginStatus.FAILED and record.name == "vendor"
    assert record.reason == "import failed: ModuleNotFoundError: No module named 'tm_test_vendor_runtime_that_does_not_exist'"
    assert record.traceback.startswith("Traceback") and "tm_test_bad_backend.py" in record.traceback


def test_entry_points_load_lazily_per_kind(tmp_path, monkeypatch):
    (tmp_path / "tm_test_lazy_quantizer.py").write_text(
        "from tokenmill.plugin_api import Quantizer\nclass Lazy(Quantizer):\n    name = 'lazy'\n    api_version = (2, 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint("lazy", "tm_test_lazy_quantizer:Lazy", "tokenmill.quantizers")
    registry = PluginRegistry.make_test_instance(quantizers=[ep], include_core=False)
    registry.records("platform")
    assert "tm_test_lazy_quantizer" not in sys.modules
    assert registry.available("quantizer")[0].name == "lazy"
    assert "tm_test_lazy_quantizer" in sys.modules
    monkeypatch.delitem(sys.modules, "tm_test_lazy_quantizer")


def test_blocked_entry_points_are_never_imported(tmp_path, monkeypatch):
    (tmp_path / "tm_test_blocked_platform.py").write_text("raise SystemExit('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint("metal", "tm_test_blocked_platform:MetalPlatform", "tokenmill.platforms")
    registry = PluginRegistry.make_test_instance(platforms=[ep], policy="-metal")
    record = registry.find("platform", "metal")[0]
    assert record.status is PluginStatus.BLOCKED and record.reason == "denied by TOKENMILL_PLUGINS"
    assert "tm_test_blocked_platform" not in sys.modules


def test_two_plugins_with_one_name_are_both_refused_but_core_keeps_its_own():
    twin = type("GoodTwin", (GoodPlatform,), {"api_version": (2, 0)})
    records = PluginRegistry.make_test_instance(platforms=[GoodPlatform, twin], include_core=False).records("platform")
    assert [r.status for r in records] == [PluginStatus.FAILED, PluginStatus.FAILED]
    assert "platform name 'good' is provided by in-memory-test and in-memory-test" in records[0].reason

    impostor = type("Impostor", (GoodPlatform,), {"name": "reference", "api_version": (2, 0)})
    registry = PluginRegistry.make_test_instance(platforms=[impostor])
    by_core = {r.is_core: r for r in registry.find("platform", "reference")}
    assert by_core[True].available and by_core[False].status is PluginStatus.FAILED


def test_core_entries_survive_any_policy_and_denying_them_warns():
    registry = PluginRegistry.make_test_instance(platforms=[GoodPlatform], policy="-reference,-good")
    assert [r.name for r in registry.available("platform")] == ["reference"]
    assert registry.warnings == ["TOKENMILL_PLUGINS denies 'reference', but core's own reference entries cannot be blocked"]


def test_policy_parsing_and_matching():
    policy = PluginPolicy.parse(" cuda, tokenmill-attn-triton ,-metal,,")
    assert policy.allow == {"cuda", "tokenmill-attn-triton"} and policy.deny == {"metal"}
    assert policy.blocked_reason("cuda", "tokenmill-cuda", False) is None
    assert policy.blocked_reason("triton", "tokenmill_attn_triton", False) is None  # by distribution name
    assert policy.blocked_reason("metal", "tokenmill-metal", False) == "denied by TOKENMILL_PLUGINS"
    assert "allow-list" in policy.blocked_reason("rocm", "tokenmill-rocm", False)
    assert policy.blocked_reason("rocm", "tokenmill", True) is None
    assert not PluginPolicy.parse("").restricts and not PluginPolicy.parse(None).restricts


def test_policy_warns_about_names_matching_nothing():
    warnings = PluginPolicy.parse("cuda,-mteal").warnings_for([("cuda", "tokenmill-cuda", False)])
    assert warnings == ["TOKENMILL_PLUGINS names 'mteal', which matches no installed plugin "
                        "(installed: cuda, tokenmill-cuda)"]


def test_discover_reads_installed_core_entries_and_caches_per_policy(monkeypatch):
    monkeypatch.delenv("TOKENMILL_PLUGINS", raising=False)
    registry = discover()
    assert discover() is registry
    assert discover(refresh=True) is not registry
    reference = [r for r in registry.records("platform") if r.is_core]
    assert [r.name for r in reference] == ["reference"] and reference[0].available
    assert reference[0].entry_point == "tokenmill.reference.platform:ReferencePlatform"
    assert reference[0].version is not None
    monkeypatch.setenv("TOKENMILL_PLUGINS", "reference")
    assert discover() is not registry and discover().policy.allow == {"reference"}
