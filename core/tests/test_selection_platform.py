"""Platform selection on simulated machines: in-memory Platform subclasses with scripted probes."""

import textwrap
from importlib.metadata import EntryPoint

import pytest

from tokenmill.discovery import PluginRegistry, PluginStatus, SelectionError, select_platform
from tokenmill.plugin_api import PLUGIN_API_VERSION, DeviceInfo, Platform, PlatformCapabilities, ProbeResult


def fake_platform(name, device_type, score, *, reasons=None, devices=(), raises=None, priority=0,
                  api_version=(2, 0)):
    def probe(cls):
        if raises is not None:
            raise raises
        return ProbeResult(score, reasons or (f"simulated {name}",), devices)

    return type(f"Fake{name.title()}Platform", (Platform,), {
        "name": name, "device_type": device_type, "priority": priority, "api_version": api_version,
        "probe": classmethod(probe), "capabilities": property(lambda self: PlatformCapabilities()),
    })


GPU = (DeviceInfo(0, "Simulated GPU 0"), DeviceInfo(1, "Simulated GPU 1"))
CUDA = fake_platform("cuda", "cuda", 100, reasons=("CUDA 12.8 with 2 devices",), devices=GPU)
ROCM = fake_platform("rocm", "cuda", 100, reasons=("ROCm 6.4 with 1 device",), devices=GPU[:1])
CPU = fake_platform("cpu", "cpu", 50, reasons=("AVX-512",), devices=(DeviceInfo(0, "host"),))
NO_CUDA = fake_platform("cuda", "cuda", 0, reasons=("no NVIDIA driver found",))


def registry(*platforms, policy=None):
    return PluginRegistry.make_test_instance(platforms=platforms, policy=policy)


def broken_import_entry_point(tmp_path, monkeypatch, module="tm_test_broken_cuda_plugin"):
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return EntryPoint("cuda", f"{module}:CudaPlatform", "tokenmill.platforms")


def test_cuda_wins_over_cpu_and_reference():
    choice = select_platform(registry(CUDA, CPU))
    assert choice.name == "cuda" and choice.platform_cls is CUDA and choice.device_index == 0
    assert {r.name for r in choice.candidates} == {"cuda", "cpu", "reference"}
    assert choice.warnings == []


def test_only_the_reference_platform_remains_on_a_bare_machine():
    choice = select_platform(registry(NO_CUDA))
    assert choice.name == "reference" and choice.score == 1
    assert choice.record.is_core


def test_cuda_and_rocm_tie_is_an_error_listing_both_with_scores():
    with pytest.raises(SelectionError) as error:
        select_platform(registry(CUDA, ROCM, CPU))
    message = str(error.value)
    assert "tie" in message
    assert "cuda (in-memory-test): score 100: CUDA 12.8 with 2 devices" in message
    assert "rocm (in-memory-test): score 100: ROCm 6.4 with 1 device" in message
    assert "--device cuda or --device rocm" in message


def test_a_pin_resolves_the_tie():
    assert select_platform(registry(CUDA, ROCM), device="rocm").name == "rocm"
    assert select_platform(registry(CUDA, ROCM), device="cuda:1").device_index == 1


def test_priority_breaks_an_equal_score_before_the_tie_error():
    preferred = fake_platform("rocm", "cuda", 100, priority=5)
    assert select_platform(registry(CUDA, preferred)).name == "rocm"


def test_tokenmill_device_env_var_pins(monkeypatch):
    monkeypatch.setenv("TOKENMILL_DEVICE", "cpu")
    choice = select_platform(registry(CUDA, CPU))
    assert choice.name == "cpu" and choice.pin == "cpu"


def test_cpu_pin_takes_the_optimised_cpu_platform_or_falls_to_reference():
    assert select_platform(registry(CUDA, CPU), device="cpu").name == "cpu"
    assert select_platform(registry(CUDA), device="cpu").name == "reference"
    assert select_platform(registry(CUDA, CPU, policy="-cpu"), device="cpu").name == "reference"
    assert select_platform(registry(CUDA, CPU), device="reference").name == "reference"


def test_a_name_pin_beats_a_device_type_match():
    # ROCm builds of torch use the "cuda" device type; --device cuda still means the cuda plugin.
    assert select_platform(registry(CUDA, ROCM), device="cuda").name == "cuda"


def test_pinning_an_unavailable_cpu_plugin_points_at_the_reference_platform():
    no_cpu = fake_platform("cpu", "cpu", 0, reasons=("needs AVX2",))
    with pytest.raises(SelectionError, match="(?s)needs AVX2.*other platforms for device type cpu: reference"):
        select_platform(registry(no_cpu), device="cpu")


def test_pinned_device_that_is_absent_names_what_is_installed():
    with pytest.raises(SelectionError, match="no installed platform is called 'xpu'.*installed: cpu, cuda, reference"):
        select_platform(registry(CUDA), device="xpu")


def test_pinned_device_that_scores_zero_gives_its_probe_reasons():
    with pytest.raises(SelectionError, match="(?s)no matching platform can run here.*no NVIDIA driver found"):
        select_platform(registry(NO_CUDA, CPU), device="cuda")


def test_pinned_index_out_of_range_lists_the_devices_found():
    with pytest.raises(SelectionError, match="no device 2 .*0: Simulated GPU 0, 1: Simulated GPU 1"):
        select_platform(registry(CUDA), device="cuda:2")
    with pytest.raises(SelectionError, match="no device 1"):
        select_platform(registry(CUDA), device="reference:1")


def test_malformed_pins_are_rejected():
    for pin in ("cuda:x", ":1", "cuda:-1"):
        with pytest.raises(SelectionError, match="--device"):
            select_platform(registry(CUDA), device=pin)


def test_plugin_that_raises_on_import_is_an_error_with_its_traceback(tmp_path, monkeypatch):
    reg = registry(broken_import_entry_point(tmp_path, monkeypatch), CPU)
    record = reg.find("platform", "cuda")[0]
    assert record.status is PluginStatus.FAILED and "libcuda.so.1" in record.reason
    with pytest.raises(SelectionError) as error:
        select_platform(reg)
    message = str(error.value)
    assert "platform plugin 'cuda'" in message and "Traceback (most recent call last)" in message
    assert "libcuda.so.1" in message and "--allow-cpu-fallback" in message


def test_allow_cpu_fallback_turns_the_broken_plugin_into_a_warning(tmp_path, monkeypatch):
    reg = registry(broken_import_entry_point(tmp_path, monkeypatch), CPU)
    choice = select_platform(reg, allow_cpu_fallback=True)
    assert choice.name == "cpu"
    assert len(choice.warnings) == 1 and "libcuda.so.1" in choice.warnings[0]
    assert "--allow-cpu-fallback" in choice.warnings[0]


def test_cpu_pin_with_a_broken_cpu_plugin_falls_to_reference_only_with_fallback(tmp_path, monkeypatch):
    (tmp_path / "tm_test_broken_cpu_plugin.py").write_text("raise OSError('libgomp.so.1 missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = registry(EntryPoint("cpu", "tm_test_broken_cpu_plugin:CpuPlatform", "tokenmill.platforms"))
    with pytest.raises(SelectionError, match="libgomp"):
        select_platform(reg, device="cpu")
    choice = select_platform(reg, device="cpu", allow_cpu_fallback=True)
    assert choice.name == "reference" and "libgomp" in choice.warnings[0]


def test_plugin_whose_probe_raises_is_an_error_unless_fallback_is_allowed():
    broken = fake_platform("cuda", "cuda", 0, raises=RuntimeError("driver/library version mismatch"))
    with pytest.raises(SelectionError, match=r"probe\(\) raised RuntimeError: driver/library version mismatch"):
        select_platform(registry(broken, CPU))
    assert select_platform(registry(broken, CPU), allow_cpu_fallback=True).name == "cpu"


def test_broken_plugin_that_the_pin_does_not_name_is_only_a_warning():
    broken = fake_platform("rocm", "cuda", 0, raises=RuntimeError("amdsmi missing"))
    choice = select_platform(registry(broken, CPU), device="cpu")
    assert choice.name == "cpu" and "amdsmi missing" in choice.warnings[0]


def test_pinning_a_broken_plugin_is_an_error_even_with_fallback():
    broken = fake_platform("cuda", "cuda", 0, raises=RuntimeError("boom"))
    with pytest.raises(SelectionError, match="boom"):
        select_platform(registry(broken, CPU), device="cuda")
    with pytest.raises(SelectionError, match="no matching platform can run here"):
        select_platform(registry(broken, CPU), device="cuda", allow_cpu_fallback=True)


def test_api_major_mismatch_is_refused_with_one_clear_line():
    future = fake_platform("cuda", "cuda", 100, api_version=(3, 0))
    reg = registry(future, CPU)
    record = reg.find("platform", "cuda")[0]
    assert record.status is PluginStatus.INCOMPATIBLE and record.probe is None  # never probed
    core = ".".join(map(str, PLUGIN_API_VERSION))
    line = (f"platform plugin 'cuda' (in-memory-test) was built for plugin API 3.0, but this tokenmill provides {core}: "
            "install a release of in-memory-test built for plugin API 2.x")
    assert record.reasons == (line,)
    with pytest.raises(SelectionError) as error:
        select_platform(reg)
    assert line in str(error.value)
    assert select_platform(reg, allow_cpu_fallback=True).name == "cpu"


def test_plugin_needing_a_newer_minor_is_refused():
    newer = (PLUGIN_API_VERSION[0], PLUGIN_API_VERSION[1] + 1)
    record = registry(fake_platform("cuda", "cuda", 100, api_version=newer)).find("platform", "cuda")[0]
    assert record.status is PluginStatus.INCOMPATIBLE
    core = ".".join(map(str, PLUGIN_API_VERSION))
    assert f"needs plugin API {newer[0]}.{newer[1]}, but this tokenmill provides {core}: upgrade tokenmill" \
        in record.reason


def test_allow_list_keeps_only_named_plugins_and_core():
    reg = registry(CUDA, CPU, policy="cpu")
    assert reg.find("platform", "cuda")[0].status is PluginStatus.BLOCKED
    assert select_platform(reg).name == "cpu"
    assert {r.name for r in reg.available("platform")} == {"cpu", "reference"}


def test_deny_list_blocks_named_plugins():
    reg = registry(CUDA, CPU, policy="-cuda,-cpu")
    assert select_platform(reg).name == "reference"
    assert all(r.status is PluginStatus.BLOCKED for r in reg.records("platform") if r.name != "reference")


def test_unknown_policy_names_warn_and_the_warning_reaches_the_choice():
    choice = select_platform(registry(CUDA, policy="cuda,cdua"))
    assert choice.name == "cuda"
    assert any("'cdua', which matches no installed plugin" in w for w in choice.warnings)
