"""``shard.json``: which part of which work list a run directory holds.

Every ``fencecheck run`` (and ``fencecheck mutants``) writes one into its run
directory when its shared services are up, and again when it ends; an
unsharded run is part 1 of 1. It names what the run was cut from (the whole
item list with the shard of every item), what it ran with (commit, worker
digest, seed, PostgreSQL server version, backend) and when it finished, so
``fencecheck merge`` can refuse parts of different runs and say exactly what
an absent or interrupted part would have run. It is written atomically: a
reader never sees half of one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.engine.job_order import expected_seconds
from harness.engine.shards import MUTANT_SERVICES_S, Shard, assign, job_key
from harness.evidence import bounded_read

if TYPE_CHECKING:
    from harness.engine.runner import Job

RECORD_NAME = "shard.json"
RECORD_VERSION = 1


class RecordInvalid(ValueError):
    """A shard.json that is missing, unreadable or not of this format."""


@dataclasses.dataclass(frozen=True)
class ShardItem:
    """One item of the whole list (an experiment run or a mutant) and its shard."""

    label: str
    shard: int
    cost_s: float
    # For experiment runs: what the reports show even when the item never ran.
    experiment: str | None = None
    variant: str | None = None
    repeat: int = 0
    title: str = ""
    invariant: str = ""
    natural_wait_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    kind: str  # "run" or "mutants"
    run_id: str
    shard_index: int
    shard_count: int
    seed: int
    git_commit: str
    worker_command: str
    worker_digest: str
    mutant: str | None
    postgres_version: str
    backend: str
    items: tuple[ShardItem, ...]
    host: str
    started_at: str
    finished_at: str | None = None
    wall_s: float | None = None
    record_version: int = RECORD_VERSION
    #: What cut the run short ("interrupted by SIGTERM"); such a part never
    #: has ``finished_at``: merge lists it as unfinished.
    interrupted: str | None = None

    @property
    def shard(self) -> Shard:
        return Shard(self.shard_index, self.shard_count)

    def mine(self) -> list[ShardItem]:
        return [i for i in self.items if i.shard == self.shard_index]

    def identity(self) -> dict[str, Any]:
        """What every part of one run must share; merge compares exactly these.

        The worker *command* is left out on purpose: it names an interpreter
        path that differs between machines; the digest of what it runs is in.
        """
        return {
            "kind": self.kind,
            "git_commit": self.git_commit,
            "worker_digest": self.worker_digest,
            "mutant": self.mutant,
            "seed": self.seed,
            "shard_count (split size)": self.shard_count,
            "postgres_version": self.postgres_version,
            "backend": self.backend,
            "item list and split": [(i.label, i.shard) for i in self.items],
        }

    def finished(self, wall_s: float) -> ShardRecord:
        return dataclasses.replace(self, finished_at=_now(), wall_s=round(wall_s, 3))

    def cut(self, why: str, wall_s: float) -> ShardRecord:
        """The record of a part a stop cut: not finished, and saying why."""
        return dataclasses.replace(self, interrupted=why, wall_s=round(wall_s, 3))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_record(
    *,
    kind: str,
    run_id: str,
    shard: Shard,
    items: Sequence[ShardItem],
    seed: int,
    worker_cmd: Sequence[str],
    mutant: str | None,
    postgres_version: str,
    backend: str,
) -> ShardRecord:
    import shlex

    from harness.evidence.archive import git_commit, worker_digest

    return ShardRecord(
        kind=kind,
        run_id=run_id,
        shard_index=shard.index,
        shard_count=shard.count,
        seed=seed,
        git_commit=git_commit(),
        worker_command=shlex.join(worker_cmd),
        worker_digest=worker_digest(tuple(worker_cmd)),
        mutant=mutant,
        postgres_version=postgres_version,
        backend=backend,
        items=tuple(items),
        host=socket.gethostname(),
        started_at=_now(),
    )


def job_items(jobs: Sequence[Job], count: int) -> list[ShardItem]:
    """Every job with its shard; raises ShardError when ``count`` parts cannot be made."""
    # Measured durations where the code keeps them (the same file on every
    # machine, so every part of a run computes the same plan).
    shard_of = assign(jobs, count, key=job_key, cost=expected_seconds)
    return [
        ShardItem(
            label=job.label,
            shard=s,
            cost_s=expected_seconds(job),
            experiment=job.spec.id,
            variant=job.variant,
            repeat=job.repeat_index,
            title=job.spec.title,
            invariant=job.spec.invariant,
            natural_wait_s=job.spec.natural_wait(job.variant),
        )
        for job, s in zip(jobs, shard_of, strict=True)
    ]


def named_items(costs: dict[str, float], count: int) -> list[ShardItem]:
    """Named items (mutants) with their expected costs, each with its shard."""
    names = list(costs)
    shard_of = assign(names, count, key=lambda n: n, cost=lambda n: MUTANT_SERVICES_S + costs[n])
    return [
        ShardItem(label=n, shard=s, cost_s=MUTANT_SERVICES_S + costs[n])
        for n, s in zip(names, shard_of, strict=True)
    ]


def write_record(run_dir: Path, record: ShardRecord) -> Path:
    """Write ``run_dir/shard.json`` atomically."""
    from harness.evidence.archive import atomic_write_text

    text = json.dumps(dataclasses.asdict(record), indent=2) + "\n"
    return atomic_write_text(run_dir / RECORD_NAME, text, mode=0o644)


def read_record(run_dir: Path) -> ShardRecord:
    """The shard.json of ``run_dir``; RecordInvalid says what is wrong with it."""
    path = run_dir / RECORD_NAME
    try:
        raw = bounded_read.load_json(path)
    except FileNotFoundError:
        raise RecordInvalid(
            f"{run_dir} has no {RECORD_NAME}: it is not a run directory of `fencecheck run` "
            "(or was written by a version without shards)"
        ) from None
    except OSError as exc:
        raise RecordInvalid(f"{path} cannot be read: {exc.strerror or exc}") from None
    except bounded_read.NotParsed as exc:
        raise RecordInvalid(str(exc)) from None
    if not isinstance(raw, dict) or raw.get("record_version") != RECORD_VERSION:
        raise RecordInvalid(f"{path} is not a shard record of version {RECORD_VERSION}")
    try:
        items = tuple(ShardItem(**item) for item in raw.pop("items"))
        return ShardRecord(items=items, **raw)
    except (KeyError, TypeError) as exc:
        raise RecordInvalid(f"{path} lacks or has unexpected fields: {str(exc)[:100]}") from exc
