"""The CLI never degrades silently: ``generate`` and ``serve`` on a quantized checkpoint whose
quantizer is blocked, or on a platform whose preferred attention backend fails to import, exit
non-zero with one clear line before anything is served; ``--allow-attention-fallback`` runs on the
next backend with a startup warning; ``tokenmill plugins`` exits 1 when a plugin failed. The broken
plugins are a real distribution (a ``.dist-info`` on PYTHONPATH) with real entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server" / "tests"))  # build_tiny_model

from server_live import build_tiny_model, free_port  # noqa: E402

TIMEOUT = 300
BLOCKED_INT8 = ("error: the checkpoint is quantized as int8 (config.json's quantization_config.quant_method) and no "
                "loaded quantizer claims it, so it cannot be loaded (read as unquantized its output would be garbage): "
                "quantizer 'int8' (tokenmill-quant-int8")
BROKEN_ATTENTION = ("attention backend 'brokenattn' (tm-test-broken-preference 0.1), preferred by platform brokenpref, "
                    "is failed: import failed: ImportError: libfastattn.so: cannot open shared object file; repair or "
                    "reinstall it, or pass --allow-attention-fallback to use the platform's next preference")
PLATFORM = '''
    from tokenmill.reference.platform import ReferencePlatform


    class BrokenPreferencePlatform(ReferencePlatform):
        """The reference platform, preferring an attention backend whose import fails."""

        name = "brokenpref"
        api_version = (2, 0)

        def attention_preference(self):
            return ("brokenattn", "reference")
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("never-silent") / "tiny")


@pytest.fixture(scope="module")
def tiny_int8(tiny, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("never-silent-int8") / "tiny-int8"
    result = tokenmill("quantize", str(tiny), str(target), "--format", "int8")
    assert result.returncode == 0, result.stderr
    return target


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    """A distribution with a platform preferring 'brokenattn' and a 'brokenattn' backend that cannot import."""
    site = tmp_path_factory.mktemp("broken-site")
    info = site / "tm_test_broken_preference-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tm-test-broken-preference\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[tokenmill.platforms]\nbrokenpref = tm_test_broken_preference_platform:BrokenPreferencePlatform\n\n"
        "[tokenmill.attention_backends]\nbrokenattn = tm_test_broken_preference_attention:Backend\n")
    (site / "tm_test_broken_preference_platform.py").write_text(textwrap.dedent(PLATFORM))
    (site / "tm_test_broken_preference_attention.py").write_text(
        'raise ImportError("libfastattn.so: cannot open shared object file")\n')
    return site


def tokenmill(*args: str, site: Path | None = None, blocked: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENMILL_PLUGINS", "TOKENMILL_DEVICE")}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))
    if blocked is not None:
        env["TOKENMILL_PLUGINS"] = blocked
    return subprocess.run([sys.executable, "-m", "tokenmill.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT)


def serve(model: Path, *args: str, **how: object) -> subprocess.CompletedProcess:
    """``tokenmill serve``; it returns only by exiting (a server that started would run until the timeout)."""
    return tokenmill("serve", str(model), "--port", str(free_port()), "--kv-cache-memory", "16MiB", *args, **how)


def generate(model: Path, *args: str, **how: object) -> subprocess.CompletedProcess:
    return tokenmill("generate", str(model), "--prompt", "Hello", "--max-tokens", "3", "--kv-cache-memory", "16MiB",
                     *args, **how)


def test_generate_refuses_a_quantized_checkpoint_whose_quantizer_is_blocked(tiny_int8):
    result = generate(tiny_int8, blocked="-int8")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(BLOCKED_INT8), result.stderr
    assert result.stderr.strip().endswith("is not loaded (blocked: denied by TOKENMILL_PLUGINS); allow it in "
                                          "TOKENMILL_PLUGINS")
    assert "---" not in result.stdout  # no completion was printed


def test_serve_refuses_it_before_serving(tiny_int8):
    result = serve(tiny_int8, blocked="tokenmill-server,tokenmill-cpu")  # an allow-list without the int8 plugin
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the engine failed to start: SelectionError: " + BLOCKED_INT8.removeprefix("error: ") in result.stderr
    assert "not in the TOKENMILL_PLUGINS allow-list (tokenmill-cpu, tokenmill-server)" in result.stderr
    assert "Traceback" not in result.stderr


def test_generate_with_a_broken_preferred_attention_backend_fails_unless_fallback_is_allowed(tiny, broken_site):
    result = generate(tiny, "--device", "brokenpref", site=broken_site)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: {BROKEN_ATTENTION}"

    allowed = generate(tiny, "--device", "brokenpref", "--allow-attention-fallback", site=broken_site)
    assert allowed.returncode == 0, allowed.stderr
    report = allowed.stdout + allowed.stderr
    assert "attention backend for full attention layers: reference" in report
    assert ("warning: attention backend brokenattn (failed) preferred by platform brokenpref is broken; using "
            "'reference' instead (--allow-attention-fallback)") in report


def test_serve_with_a_broken_preferred_attention_backend_exits_before_serving(tiny, broken_site):
    result = serve(tiny, "--device", "brokenpref", site=broken_site)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the engine failed to start: SelectionError: {BROKEN_ATTENTION}" in result.stderr


def test_tokenmill_plugins_prints_the_table_and_exits_1_when_a_plugin_failed(broken_site):
    result = tokenmill("plugins", site=broken_site)
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if " brokenattn " in line)
    assert row.startswith("attention_backend") and "failed" in row and "import failed: ImportError" in row
    assert "* would be chosen: platform cpu" in result.stdout
    assert result.stderr == "error: 1 plugin cannot be used: attention backend 'brokenattn' (failed)\n"
