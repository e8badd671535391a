"""The plugin contract's allowlist on synthetic trees (sources, tests, dynamic imports, core and server
left alone) and on the real tree."""

import textwrap

from ci import check_plugin_contract

CORE_INIT = """
    _LAZY = {"LLM": "tokenmill.llm", "SamplingParams": "tokenmill.sampling_params"}
    __all__ = ["__version__", *_LAZY]
"""


def tree(root, files):
    for relative, text in {"core/src/tokenmill/__init__.py": CORE_INIT, **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return check_plugin_contract.violations(root)


def test_the_repository_keeps_plugins_on_the_contract():
    found = check_plugin_contract.violations()
    assert not found, "plugin contract violations:\n" + "\n".join(found)


def test_public_top_level_names_are_read_from_the_core_package(tmp_path):
    tree(tmp_path, {})
    assert check_plugin_contract.public_top_level_names(tmp_path) == {"__version__", "LLM", "SamplingParams"}


def test_plugin_sources_may_import_only_the_contract(tmp_path):
    found = tree(tmp_path, {
        "platforms/acme/src/tokenmill_acme/platform.py": """
            from tokenmill.plugin_api import Platform
            from tokenmill.plugin_api.native import native_call
            from tokenmill import plugin_api
            import tokenmill.plugin_api.graphs as graphs
            from tokenmill.layers.linear import Linear
            from tokenmill import LLM
            import tokenmill
            from .kernels import fast

            def later():
                import tokenmill.runner.graph_runner
                return importlib.import_module("tokenmill.engine")
        """,
    })
    assert [v.split(": ", 1)[0] for v in found] == [f"platforms/acme/src/tokenmill_acme/platform.py:{line}"
                                                   for line in (6, 7, 8, 12, 13)]
    assert "imports tokenmill.layers.linear; a plugin source may import only tokenmill.plugin_api" in found[0]
    assert "imports tokenmill.LLM;" in found[1] and "imports tokenmill;" in found[2]


def test_plugin_tests_may_also_use_the_public_top_level_names(tmp_path):
    found = tree(tmp_path, {
        "quantization/acme/src/tokenmill_quant_acme/__init__.py": "",
        "quantization/acme/tests/test_acme.py": """
            import pytest
            import tokenmill
            from tokenmill import LLM, SamplingParams
            from tokenmill.plugin_api.linear import Linear
            from tokenmill import EngineCore, SamplingParams
            from tokenmill.scheduler import Scheduler
            runner = pytest.importorskip("tokenmill.runner.model_runner")
        """,
        "quantization/acme/tests/conftest.py": "from tokenmill.reference.paged_harness import PagedHarness\n",
        "plugins/examples/toy/src/tokenmill_toy/__init__.py": "",
        "plugins/examples/toy/tests/test_toy.py": "from tokenmill.discovery import PluginRegistry\n",
    })
    assert sorted(v.split(": ", 1)[0] for v in found) == sorted([
        "quantization/acme/tests/conftest.py:1", "quantization/acme/tests/test_acme.py:6",
        "quantization/acme/tests/test_acme.py:7", "quantization/acme/tests/test_acme.py:8",
        "plugins/examples/toy/tests/test_toy.py:1"])
    assert any("imports tokenmill.EngineCore; a plugin test may import only" in v for v in found)


def test_core_and_server_are_not_plugins(tmp_path):
    found = tree(tmp_path, {
        "core/src/tokenmill/engine/core.py": "from tokenmill.scheduler import Scheduler\n",
        "core/tests/test_core.py": "from tokenmill.runner.model_runner import ModelRunner\n",
        "server/src/tokenmill_server/app.py": "from tokenmill.frontend.async_llm import AsyncLLM\n",
        "server/tests/test_app.py": "from tokenmill.frontend import llm_engine\n",
    })
    assert found == []
