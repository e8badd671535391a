"""JSON schemas that nothing satisfies are refused before compiling (xgrammar takes some as "anything")."""

import pytest

from tokenmill.structured import StructuredOutputsParams
from tokenmill.structured.empty_schemas import unsatisfiable_reason


@pytest.mark.parametrize("schema", [
    False, {"not": {}}, {"not": True}, {"anyOf": []}, {"oneOf": []}, {"enum": []}, {"type": []},
    {"anyOf": [False, {"not": {}}]}, {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "string", "allOf": [{"type": ["object", "array"]}]},
    {"type": "object", "properties": {"a": {"anyOf": []}}, "required": ["a"]},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {"b": False}, "required": ["b"]}},
     "required": ["outer"]},
])
def test_unsatisfiable_schemas_are_named(schema):
    assert unsatisfiable_reason(schema)
    if isinstance(schema, dict):
        with pytest.raises(ValueError, match="no value can satisfy"):
            StructuredOutputsParams(json=schema).check_grammar()


@pytest.mark.parametrize("schema", [
    True, {}, {"type": "object"}, {"anyOf": [False, {"type": "string"}]}, {"not": {"type": "string"}},
    {"allOf": [{"type": "number"}, {"type": "integer"}]},
    {"type": "object", "properties": {"a": False}},  # a may be left out
    {"properties": {"a": False}, "required": ["a"]},  # any non-object value satisfies it
])
def test_satisfiable_schemas_pass(schema):
    assert unsatisfiable_reason(schema) is None
