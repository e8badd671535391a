"""JSON schemas that no value can satisfy, found before compiling.

xgrammar refuses ``false`` and some contradictions (minimum above maximum), but compiles others
(``{"not": {}}``, an empty ``anyOf``, an empty ``type`` list, ``allOf`` branches of disjoint types)
into a grammar that accepts *anything*, which would silently drop the request's constraint."""

from __future__ import annotations

from typing import Any

_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
MAX_NODES = 10_000  # a bound on the walk; larger schemas are left to the compiler


def _types(node: dict[str, Any]) -> frozenset[str] | None:
    """The JSON types ``node`` allows by its ``type`` keyword (None: any type, or a malformed ``type``
    that the compiler reports)."""
    declared = node.get("type")
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not all(name in _ALL_TYPES for name in names if isinstance(name, str)) or \
            not all(isinstance(name, str) for name in names):
        return None
    allowed = set(names)
    if "number" in allowed:
        allowed.add("integer")  # every integer is a number
    return frozenset(allowed)


class _Walk:
    def __init__(self) -> None:
        self.nodes = 0

    def reason(self, node: Any, where: str) -> str | None:
        """Why no value satisfies ``node`` at ``where`` (a JSON pointer), or None when it may be satisfiable."""
        self.nodes += 1
        if node is False:
            return f"the schema at '{where or '/'}' is false"
        if not isinstance(node, dict) or self.nodes > MAX_NODES:
            return None
        types = _types(node)
        if types is not None and not types:
            return f"the schema at '{where or '/'}' allows no type"
        negated = node.get("not")
        if negated is True or negated == {}:
            return f"the schema at '{where or '/'}' is 'not' of a schema that accepts everything"
        for keyword in ("enum", "anyOf", "oneOf"):
            branches = node.get(keyword)
            if isinstance(branches, list) and not branches:
                return f"the schema at '{where or '/'}' has an empty '{keyword}'"
        for keyword in ("anyOf", "oneOf"):
            branches = node.get(keyword)
            if isinstance(branches, list):
                reasons = [self.reason(branch, f"{where}/{keyword}/{i}") for i, branch in enumerate(branches)]
                if all(reasons):
                    return reasons[0]
        for i, branch in enumerate(node.get("allOf") or ()):
            found = self.reason(branch, f"{where}/allOf/{i}")
            if found:
                return found
            if isinstance(branch, dict) and (branch_types := _types(branch)) is not None:
                types = branch_types if types is None else types & branch_types
                if not types:
                    return f"the 'allOf' at '{where or '/'}' joins schemas of disjoint types"
        properties = node.get("properties")
        required = node.get("required")
        if types == frozenset({"object"}) and isinstance(properties, dict) and isinstance(required, list):
            for name in required:
                if isinstance(name, str) and name in properties:
                    found = self.reason(properties[name], f"{where}/properties/{name}")
                    if found:
                        return found
        return None


def unsatisfiable_reason(schema: Any) -> str | None:
    """Why no JSON value satisfies ``schema``, or None (the check is partial: None is not a proof)."""
    return _Walk().reason(schema, "")
