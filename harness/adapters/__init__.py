"""Adapters that put systems nobody here wrote under test: one folder per
system, each with its mapping (fencecheck-mapping.yaml) and a thin driver
using only the system's public API or its own SQL (docs/analyses/).
The harness never imports them: they are workers like any other.
"""
