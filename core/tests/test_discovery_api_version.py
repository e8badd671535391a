"""Discovery refuses a plugin that does not state the plugin API it was built against itself (a class
attribute inherited from another class does not count, nor does a hook module without one), and one
built for a newer minor or another major, each with one line that ``tokenmill plugins`` shows."""

from importlib.metadata import EntryPoint

from tokenmill.cli.main import main
from tokenmill.cli.plugins_command import plugin_listing
from tokenmill.discovery import PluginRegistry, PluginStatus
from tokenmill.plugin_api import PLUGIN_API_VERSION, AttentionBackend, Platform, PlatformCapabilities, ProbeResult
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend

MAJOR, MINOR = PLUGIN_API_VERSION
CORE = f"{MAJOR}.{MINOR}"


class DeclaredPlatform(Platform):
    name = "declared"
    device_type = "cpu"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(10, ("here",))

    @property
    def capabilities(self):
        return PlatformCapabilities()


class UndeclaredPlatform(DeclaredPlatform):
    """Inherits DeclaredPlatform's api_version, which says nothing about what this class was built for."""

    name = "undeclared"


class QuietBackend(AttentionBackend):
    """Declares nothing and has no base that does."""

    name = "quiet"


class CopiedReference(ReferenceAttentionBackend):
    """Would otherwise take core's own reference backend's version, whatever core it is installed with."""

    name = "copied"


def _platform(name, version):
    return type(f"{name.title()}Platform", (DeclaredPlatform,), {"name": name, "api_version": version})


def test_a_plugin_class_that_declares_no_api_version_itself_is_refused_with_one_line():
    registry = PluginRegistry.make_test_instance(platforms=[DeclaredPlatform, UndeclaredPlatform],
                                                 attention_backends=[QuietBackend, CopiedReference], include_core=False)
    assert registry.find("platform", "declared")[0].available
    expected = {"undeclared": "in its class body", "quiet": "in its class body", "copied": "in its class body"}
    for kind in ("platform", "attention_backend"):
        for record in registry.records(kind):
            if record.name in expected:
                assert record.status is PluginStatus.FAILED and record.api_version is None
                assert record.reasons == (f"declares no api_version: set api_version = ({MAJOR}, {MINOR}) in its class "
                                          f"body, the plugin API it is built against (this tokenmill provides {CORE})",)
    assert registry.find("platform", "undeclared")[0].probe is None  # refused before its probe runs


def test_a_newer_minor_and_another_major_are_incompatible():
    registry = PluginRegistry.make_test_instance(
        platforms=[_platform("newer", (MAJOR, MINOR + 1)), _platform("older", (MAJOR - 1, 7)),
                   _platform("future", (MAJOR + 1, 0))], include_core=False)
    status = {r.name: (r.status, r.reason) for r in registry.records("platform")}
    assert status["newer"] == (PluginStatus.INCOMPATIBLE, f"platform plugin 'newer' (in-memory-test) needs plugin API "
                                                          f"{MAJOR}.{MINOR + 1}, but this tokenmill provides {CORE}: "
                                                          f"upgrade tokenmill")
    for name, version in (("older", f"{MAJOR - 1}.7"), ("future", f"{MAJOR + 1}.0")):
        assert status[name] == (PluginStatus.INCOMPATIBLE, f"platform plugin '{name}' (in-memory-test) was built for "
                                                           f"plugin API {version}, but this tokenmill provides {CORE}: "
                                                           f"install a release of in-memory-test built for plugin "
                                                           f"API {MAJOR}.x")


def test_hook_modules_declare_a_module_level_api_version(tmp_path, monkeypatch):
    hooks = "from tokenmill.plugin_api import hookimpl\n\n@hookimpl\ndef on_engine_stop():\n    pass\n"
    (tmp_path / "tm_test_declared_hooks.py").write_text(f"api_version = ({MAJOR}, {MINOR})\n{hooks}")
    (tmp_path / "tm_test_silent_hooks.py").write_text(hooks)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points = [EntryPoint(name, f"tm_test_{name}_hooks", "tokenmill.plugins") for name in ("declared", "silent")]
    records = {r.name: r for r in PluginRegistry.make_test_instance(plugins=entry_points, include_core=False)
               .records("plugin")}
    assert records["declared"].available and records["declared"].api_version == PLUGIN_API_VERSION
    assert records["silent"].status is PluginStatus.FAILED
    assert records["silent"].reason.startswith(f"declares no api_version: set api_version = ({MAJOR}, {MINOR}) "
                                               f"at module level")


def test_tokenmill_plugins_shows_the_refusal_and_exits_1(capsys):
    registry = PluginRegistry.make_test_instance(platforms=[UndeclaredPlatform])
    listing = plugin_listing(registry, verbose=True)
    row = next(line for line in listing.splitlines() if " undeclared " in line)
    assert "failed" in row and "declares no api_version: set api_version" in row
    assert main(["plugins"], registry=registry) == 1
    assert capsys.readouterr().err == "error: 1 plugin cannot be used: platform 'undeclared' (failed)\n"
