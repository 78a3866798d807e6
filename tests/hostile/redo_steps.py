"""A worker that redoes every completed step when it resumes a run.

It keeps its progress under a key of its own (the reference state has no
``step`` key at all), so a check reading ``state_json.step`` sees nothing
repeated; experiment I must still fail: its "no step redone" judges the
``current_step`` of each protected write (contract §7) and the tool's log.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from reference_impl import checkpoint_schema, worker
from reference_impl.protocol import Protocol


def decode_from_the_start(
    self: Protocol, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
) -> checkpoint_schema.Checkpoint:
    ck = checkpoint_schema.decode(revision, schema_version, state, stored_hash)
    return dataclasses.replace(ck, state={**ck.state, "cursor": 0, "progress": ck.state["cursor"]})


if __name__ == "__main__":
    Protocol.decode_checkpoint = decode_from_the_start  # type: ignore[method-assign]
    sys.exit(worker.main())
