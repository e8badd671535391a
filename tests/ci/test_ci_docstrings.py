"""Docstring coverage of the plugin API, on a synthetic tree and on the real one."""

import textwrap

from ci import check_docstrings


def test_the_plugin_api_is_documented():
    found = check_docstrings.violations()
    assert not found, "undocumented plugin API:\n" + "\n".join(found)


def test_missing_docstrings_are_listed(tmp_path):
    api = tmp_path / "core/src/tokenmill/plugin_api"
    api.mkdir(parents=True)
    (api / "thing.py").write_text(textwrap.dedent('''
        """A module."""

        def documented():
            """Yes."""

        def bare():
            pass

        def _private():
            pass

        class Thing:
            """A thing."""

            def __init__(self):
                pass

            @property
            def size(self):
                return 1

            @classmethod
            def make(cls):
                """Make one."""

        class Naked:
            pass
    '''))
    (api / "empty.py").write_text("")
    assert check_docstrings.violations(tmp_path) == [
        "core/src/tokenmill/plugin_api/empty.py: module has no docstring",
        "core/src/tokenmill/plugin_api/thing.py:7: function bare has no docstring",
        "core/src/tokenmill/plugin_api/thing.py:20: Thing.size has no docstring",
        "core/src/tokenmill/plugin_api/thing.py:27: class Naked has no docstring",
    ]


def test_subpackages_of_the_plugin_api_are_checked(tmp_path):
    package = tmp_path / "core/src/tokenmill/plugin_api/family"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A family of helpers."""\n')
    (package / "helper.py").write_text('"""A helper."""\n\ndef bare():\n    pass\n')
    assert check_docstrings.violations(tmp_path) == [
        "core/src/tokenmill/plugin_api/family/helper.py:3: function bare has no docstring",
    ]
