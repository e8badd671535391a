"""build_native_library's cache key: a library is rebuilt when its source or a local header it
includes changes, and reused otherwise."""

from __future__ import annotations

import pytest

from tokenmill.plugin_api.native import build_native_library, compiler, source_text

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")


def test_the_source_text_takes_in_local_headers_once(tmp_path):
    (tmp_path / "inner.h").write_text("#define INNER 2\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\n#define OUTER INNER\n')
    source = tmp_path / "lib.c"
    source.write_text('#include <stdint.h>\n#include "outer.h"\n#include "inner.h"\nint value(void) { return OUTER; }\n')
    text = source_text(source)
    assert text.count(b"#define INNER 2") == 1 and b"#define OUTER INNER" in text
    assert b"stdint" in text and text.count(b"int value") == 1


def test_a_changed_header_builds_a_new_library(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "value.h").write_text("#define VALUE 2\n")
    source = tmp_path / "lib.c"
    source.write_text('#include "value.h"\nint value(void) { return VALUE; }\n')
    assert build_native_library(source, "test library").value() == 2
    (tmp_path / "value.h").write_text("#define VALUE 3\n")
    assert build_native_library(source, "test library").value() == 3
    assert len(list((tmp_path / "cache" / "cpu_kernels").glob("lib-*.so"))) == 2
