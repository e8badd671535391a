"""A broken attention backend (failed import, refused plugin API version) that the platform prefers
or the user pinned is an error naming it; ``allow_fallback`` (``--allow-attention-fallback``) passes
over a preferred one with a warning. Unavailable, blocked and uninstalled backends stay ordinary
rejections."""

from importlib.metadata import EntryPoint

import pytest

from tokenmill.discovery import PluginRegistry, SelectionError, select_attention_backend
from tokenmill.plugin_api import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionSpec,
    Platform,
    PlatformCapabilities,
    ProbeResult,
)

SPEC = AttentionSpec(num_heads=8, num_kv_heads=2, head_size=64, scale=0.125, dtype="float32")


def backend(name, api_version=(2, 0)):
    return type(f"{name.title()}Backend", (AttentionBackend,), {
        "name": name, "api_version": api_version,
        "capabilities": AttentionCapabilities(device_types=("cpu",), dtypes=("float32",))})


class Host(Platform):
    name = "host"
    device_type = "cpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(10, ("here",))

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("float32",))

    def attention_preference(self):
        return ("fast", "reference")


@pytest.fixture
def broken_import(tmp_path, monkeypatch):
    (tmp_path / "tm_test_fast_attention.py").write_text("import tm_test_fast_kernels_that_do_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return EntryPoint("fast", "tm_test_fast_attention:FastBackend", "tokenmill.attention_backends")


def registry(*backends, policy=None):
    return PluginRegistry.make_test_instance(attention_backends=[*backends, backend("reference")], policy=policy,
                                             include_core=False)


def test_a_preferred_backend_that_fails_to_import_is_an_error(broken_import):
    with pytest.raises(SelectionError) as error:
        select_attention_backend(registry(broken_import), Host(), SPEC)
    assert str(error.value) == (
        "attention backend 'fast' (tm_test_fast_attention:FastBackend), preferred by platform host, is failed: import "
        "failed: ModuleNotFoundError: No module named 'tm_test_fast_kernels_that_do_not_exist'; repair or reinstall "
        "it, or pass --allow-attention-fallback to use the platform's next preference")


def test_a_preferred_backend_refused_for_its_api_version_is_an_error():
    with pytest.raises(SelectionError, match=r"^attention backend 'fast' \(in-memory-test\), preferred by platform "
                                             r"host, is incompatible: attention backend plugin 'fast' \(in-memory-test\) "
                                             r"was built for plugin API 3.0"):
        select_attention_backend(registry(backend("fast", (3, 0))), Host(), SPEC)


def test_the_allow_flag_passes_over_it_with_a_warning(broken_import):
    choice = select_attention_backend(registry(broken_import), Host(), SPEC, allow_fallback=True)
    assert choice.name == "reference" and [r.name for r in choice.rejections] == ["fast"]
    assert choice.warnings == ["attention backend fast (failed) preferred by platform host is broken; using "
                               "'reference' instead (--allow-attention-fallback)"]


def test_a_pinned_broken_backend_is_an_error_even_with_the_allow_flag(broken_import):
    with pytest.raises(SelectionError, match=r"(?s)--attention-backend fast cannot serve.*failed: import failed"):
        select_attention_backend(registry(broken_import), Host(), SPEC, override="fast", allow_fallback=True)


def test_a_broken_backend_the_platform_does_not_prefer_changes_nothing(broken_import):
    other = EntryPoint("other", broken_import.value, broken_import.group)
    choice = select_attention_backend(registry(other, backend("fast")), Host(), SPEC)
    assert choice.name == "fast" and choice.warnings == []


def test_blocked_unavailable_and_missing_preferred_backends_are_ordinary_rejections():
    assert select_attention_backend(registry(backend("fast"), policy="-fast"), Host(), SPEC).name == "reference"
    unavailable = type("FastBackend", (backend("fast"),), {
        "api_version": (2, 0), "availability": classmethod(lambda cls: "needs the fast kernel library")})
    choice = select_attention_backend(registry(unavailable), Host(), SPEC)
    assert choice.name == "reference" and choice.rejections[0].reasons == ("unavailable: needs the fast kernel library",)
    assert select_attention_backend(registry(), Host(), SPEC).name == "reference"
