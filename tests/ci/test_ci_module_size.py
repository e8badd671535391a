"""The module size budget, on synthetic trees and on the real one."""

from ci import check_module_size


def write(root, relative, lines):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines)


def test_the_repository_is_within_budget():
    found = check_module_size.violations()
    assert not found, "modules over budget:\n" + "\n".join(found)


def test_oversized_modules_are_reported_and_tests_are_ignored(tmp_path):
    write(tmp_path, "core/src/tokenmill/big.py", 401)
    write(tmp_path, "core/src/tokenmill/ok.py", 400)
    write(tmp_path, "platforms/cuda/src/tokenmill_cuda/huge.py", 500)
    write(tmp_path, "platforms/cuda/tests/test_huge.py", 900)
    write(tmp_path, "core/src/tokenmill/test_inline.py", 900)
    found = check_module_size.violations(tmp_path, allowlist=tmp_path / "none.txt")
    assert [v.split(":")[0] for v in found] == ["core/src/tokenmill/big.py", "platforms/cuda/src/tokenmill_cuda/huge.py"]
    assert "401 lines (budget 400)" in found[0]


def test_allowlist_needs_justifications_and_stays_fresh(tmp_path):
    write(tmp_path, "core/src/tokenmill/big.py", 450)
    write(tmp_path, "core/src/tokenmill/small.py", 10)
    allowlist = tmp_path / "allow.txt"
    allowlist.write_text("# comment\ncore/src/tokenmill/big.py  # one table of opcodes\n")
    assert check_module_size.violations(tmp_path, allowlist=allowlist) == []
    allowlist.write_text("core/src/tokenmill/big.py\ncore/src/tokenmill/small.py  # was big once\n")
    found = check_module_size.violations(tmp_path, allowlist=allowlist)
    assert found == ["allow.txt:1: 'core/src/tokenmill/big.py' has no '# justification'",
                     "ci/allow.txt: stale entry 'core/src/tokenmill/small.py' (has 10 lines); remove it"]
