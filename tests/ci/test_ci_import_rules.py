"""Import rules, on synthetic trees (each rule must catch its violation) and on the real tree."""

import textwrap

from ci import check_import_rules


def tree(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return check_import_rules.violations(root)


def test_the_repository_follows_the_import_rules():
    found = check_import_rules.violations()
    assert not found, "import rule violations:\n" + "\n".join(found)


def test_plugin_api_may_not_import_the_rest_of_tokenmill(tmp_path):
    found = tree(tmp_path, {
        "core/src/tokenmill/__init__.py": "",
        "core/src/tokenmill/plugin_api/__init__.py": "from tokenmill.plugin_api.platform import Platform\n",
        "core/src/tokenmill/plugin_api/platform.py": """
            from . import version
            from .. import engine
            import tokenmill.engine.core
            def later():
                from tokenmill.scheduler import Scheduler
        """,
    })
    assert [v.split(": ", 1)[0] for v in found] == ["core/src/tokenmill/plugin_api/platform.py:3",
                                                   "core/src/tokenmill/plugin_api/platform.py:4",
                                                   "core/src/tokenmill/plugin_api/platform.py:6"]
    assert "imports tokenmill.engine;" in found[0] and "imports tokenmill.scheduler;" in found[2]


def test_core_may_not_name_device_runtimes_or_vendor_libraries(tmp_path):
    found = tree(tmp_path, {
        "core/src/tokenmill/engine/runner.py": """
            import torch
            import torch as th
            import pynvml
            from torch import cuda
            from torch.backends import mps
            import intel_extension_for_pytorch as ipex

            def step(x):
                th.cuda.synchronize()
                if x.is_cuda:
                    return torch.version.cuda
                return torch.zeros(1)
        """,
    })
    lines = sorted(int(v.split(":")[1]) for v in found)
    assert lines == [4, 5, 6, 7, 10, 11, 12], found
    assert any("core uses torch.cuda.synchronize" in v for v in found)


def test_scheduler_kv_cache_and_request_stay_torch_free(tmp_path):
    found = tree(tmp_path, {
        "core/src/tokenmill/__init__.py": "",
        "core/src/tokenmill/util.py": "import torch\n",
        "core/src/tokenmill/pure.py": "X = 1\n",
        "core/src/tokenmill/scheduler/__init__.py": "",
        "core/src/tokenmill/scheduler/policy.py": """
            from typing import TYPE_CHECKING
            from tokenmill import pure
            if TYPE_CHECKING:
                from tokenmill.util import thing
            def lazy():
                from tokenmill import util
        """,
        "core/src/tokenmill/scheduler/direct.py": "def f():\n    import torch\n",
        "core/src/tokenmill/kv_cache/__init__.py": "from tokenmill.util import helper\n",
        "core/src/tokenmill/request.py": "from tokenmill.kv_cache import x\n",
    })
    assert sorted(found) == sorted([
        "core/src/tokenmill/kv_cache/__init__.py:1: tokenmill.kv_cache imports torch indirectly: "
        "tokenmill.kv_cache -> tokenmill.util -> torch",
        "core/src/tokenmill/request.py:1: tokenmill.request imports torch indirectly: "
        "tokenmill.request -> tokenmill.kv_cache -> tokenmill.util -> torch",
        "core/src/tokenmill/scheduler/direct.py:2: tokenmill.scheduler.direct imports torch; the scheduler, "
        "KV-cache manager and requests stay pure Python",
    ])


def test_first_party_plugins_use_only_public_names(tmp_path):
    found = tree(tmp_path, {
        "platforms/cuda/src/tokenmill_cuda/platform.py": """
            from tokenmill.plugin_api import Platform
            from tokenmill.engine import LLM
            from tokenmill.engine._loop import step
            from tokenmill.kv_cache import _hash
            import tokenmill._internal
            from ._kernels import fast
        """,
        "platforms/cuda/tests/test_x.py": "from tokenmill._internal import y\n",
    })
    assert [v.split(": ", 1)[0] for v in found] == ["platforms/cuda/src/tokenmill_cuda/platform.py:4",
                                                   "platforms/cuda/src/tokenmill_cuda/platform.py:5",
                                                   "platforms/cuda/src/tokenmill_cuda/platform.py:6"]
    assert "uses tokenmill's private _loop" in found[0]


def test_engine_core_may_not_import_the_front_end(tmp_path):
    found = tree(tmp_path, {
        "core/src/tokenmill/__init__.py": "",
        "core/src/tokenmill/wire.py": "",
        "core/src/tokenmill/frontend/stats.py": "from tokenmill.engine_core.builder import build\n",
        "core/src/tokenmill/engine_core/builder.py": """
            from tokenmill import wire
            from tokenmill.frontend.stats import IterationStats
            def later():
                from tokenmill import frontend
        """,
    })
    assert [v.split(": ", 1)[0] for v in found] == ["core/src/tokenmill/engine_core/builder.py:3",
                                                   "core/src/tokenmill/engine_core/builder.py:5"]
    assert all("reaches it only through tokenmill.wire" in v for v in found)
