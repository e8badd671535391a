"""Repository checks run by ``make test`` (through tests/ci/) and by hand with ``python -m ci``:
module size budget, import rules and plugin-API docstring coverage. Each check returns a list of
human-readable violations; an empty list means the tree passes."""
