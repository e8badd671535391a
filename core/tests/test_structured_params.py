"""StructuredOutputsParams: exactly one constraint, validated on construction; grammar errors carry the
parser's message; SamplingParams takes the constraint as a dict and sends it across the socket."""

import json
import re

import msgspec
import pytest

from tokenmill.sampling_params import SamplingParams
from tokenmill.structured import StructuredOutputsParams
from tokenmill.structured.params import choice_regex, grammar_error


@pytest.mark.parametrize("fields", [{}, {"json": {}, "regex": "a"}, {"choice": []}, {"choice": ["a", 1]},
                                    {"regex": ""}, {"json": 5}, {"json_object": False}, {"choice": ["x"] * 1025}])
def test_exactly_one_well_formed_constraint(fields):
    with pytest.raises(ValueError, match="structured outputs"):
        StructuredOutputsParams(**fields)


def test_kind_and_key():
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    params = StructuredOutputsParams(json=schema)
    assert params.kind == "json"
    assert params.key()[1].index('"b"') < params.key()[1].index('"a"')  # property order is the output's order
    assert StructuredOutputsParams(json_object=True).key() == ("json_object", "")
    assert StructuredOutputsParams(choice=["a.b", "c"]).key() == ("regex", r"(a\.b|c)")
    assert StructuredOutputsParams(grammar='root ::= "x"').key() == ("grammar", 'root ::= "x"')


def test_choice_regex_matches_exactly_the_choices():
    pattern = re.compile(choice_regex(["1+1", "(x)", "y|z"]))
    assert all(pattern.fullmatch(c) for c in ["1+1", "(x)", "y|z"])
    assert not pattern.fullmatch("11") and not pattern.fullmatch("y")


@pytest.mark.parametrize("fields, message", [
    ({"json": {"type": 123}}, "invalid json: Type should be a string"),
    ({"json": "{bad"}, "json is not valid JSON"),
    ({"regex": "a(b"}, "invalid regex: Regex parsing error"),
    ({"grammar": "root ::= "}, "invalid grammar: EBNF parser error"),
])
def test_malformed_constraints_name_the_parser_error(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        StructuredOutputsParams(**fields).check_grammar()
    assert ".cc:" not in str(caught.value)  # no C++ source locations


def test_well_formed_constraints_pass():
    for fields in ({"json": {"type": "object"}}, {"json": "{}"}, {"regex": "[0-9]+"}, {"choice": ["yes", "no"]},
                   {"grammar": 'root ::= "a" | "b"'}, {"json_object": True}):
        StructuredOutputsParams(**fields).check_grammar()


def test_grammar_error_strips_timestamp_and_location():
    assert grammar_error(RuntimeError("[12:00:01] /project/cpp/x.cc:12: Bad thing\n")) == "Bad thing"
    assert grammar_error(RuntimeError("plain")) == "plain"


def test_sampling_params_take_a_dict_and_cross_the_socket():
    params = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert params.structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    assert decoded.structured_outputs == params.structured_outputs
    with pytest.raises(ValueError):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})


def test_constraints_are_bounded():
    from tokenmill.structured.params import MAX_CONSTRAINT_CHARS, MAX_JSON_DEPTH

    nested = {"type": "integer"}
    for _ in range((MAX_JSON_DEPTH - 1) // 2):  # two levels each: the schema and its properties
        nested = {"type": "object", "properties": {"a": nested}}
    StructuredOutputsParams(json=nested)  # 63 levels: allowed
    with pytest.raises(ValueError, match="nests deeper"):
        StructuredOutputsParams(json={"type": "object", "properties": {"a": nested}})
    with pytest.raises(ValueError, match="nests deeper"):
        StructuredOutputsParams(json="[" * 100 + "]" * 100)
    with pytest.raises(ValueError, match="characters long"):
        StructuredOutputsParams(regex="a" * (MAX_CONSTRAINT_CHARS + 1))
    with pytest.raises(ValueError, match="characters long"):
        StructuredOutputsParams(choice=["x" * 1000] * 300)


def test_structural_tags_in_both_forms():
    schema = {"type": "object", "properties": {"zone": {"type": "string"}}}
    legacy = {"structures": [{"begin": "<function=get_time>", "schema": schema, "end": "</function>"}],
              "triggers": ["<function="]}
    current = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<function="], "tags": [
        {"begin": "<function=get_time>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</function>"}]}}
    for tag in (legacy, current):
        params = StructuredOutputsParams(structural_tag=json.dumps(tag))
        params.check_grammar()
        assert params.kind == "structural_tag"
    for bad, message in [({"type": "structural_tag", "format": {"type": "nope"}}, "Format type not recognized"),
                         ({"structures": [{"begin": "x"}], "triggers": []}, "needs begin, schema and end"),
                         ([1], "must be an object")]:
        with pytest.raises(ValueError, match=message):
            StructuredOutputsParams(structural_tag=json.dumps(bad)).check_grammar()
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputsParams(structural_tag="{")
