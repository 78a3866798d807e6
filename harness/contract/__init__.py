"""The worker contract v2 in machine-readable form, and the check that holds a worker to it.

docs/worker-contract.md is the contract in prose; this package ships what a
program can read: ``schema.sql`` (the tables, keys, roles and tenant binding
a worker's ``migrate`` leaves behind), ``operations.json`` (every ``ops``
operation: plane, what it changes, which lease identity it takes, whether it
advances the revision, the experiments that judge it), and the JSON Schemas
under ``schemas/`` (ops requests and replies, history lines, injection-point
requests). ``fencecheck contract`` (:mod:`harness.contract.conformance`)
checks a worker command against all of it in seconds; experiment R derives
its table of stale-holder cases from ``operations.json``.
"""

from __future__ import annotations

from pathlib import Path

CONTRACT_VERSION = 2
CONTRACT_DOC = "docs/worker-contract.md"
HERE = Path(__file__).parent
SCHEMAS = HERE / "schemas"
