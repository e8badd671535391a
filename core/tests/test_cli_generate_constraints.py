"""``tokenmill generate`` with --regex / --choice / --json-schema on a tiny model: the printed output
follows the constraint; a malformed one is an error before any model loads."""

import argparse

import pytest
from hf_parity import save_bracketed_llama

from tokenmill.cli import generate_command


def parse(*argv):
    parser = argparse.ArgumentParser()
    generate_command.register_commands(parser.add_subparsers())
    return parser.parse_args(["generate", *argv])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_bracketed_llama(tmp_path_factory.mktemp("generate") / "tiny")


def first_answer(capsys) -> str:
    return capsys.readouterr().out.split("---")[0].strip()


def test_choice_and_regex(model, capsys):
    assert generate_command.run(parse(model, "-p", "<5> <6>", "--choice", "<7><8>", "--choice", "<9>",
                                      "--kv-cache-memory", "16MiB")) == 0
    assert first_answer(capsys).replace(" ", "") in ("<7><8>", "<9>")
    assert generate_command.run(parse(model, "-p", "<5>", "--regex", "(<3>|<4>)<5>", "--kv-cache-memory", "16MiB")) == 0
    assert first_answer(capsys).replace(" ", "") in ("<3><5>", "<4><5>")


def test_malformed_constraint_is_an_error(model, capsys, tmp_path):
    assert generate_command.run(parse(model, "-p", "x", "--regex", "a(")) == 1
    assert "invalid regex" in capsys.readouterr().err
    assert generate_command.run(parse(model, "-p", "x", "--json-schema", f"@{tmp_path / 'missing.json'}")) == 1
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(model, "-p", "x", "--regex", "a", "--choice", "b")
