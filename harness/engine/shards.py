"""Split a list of work items over N CI jobs, the same way on every machine.

``fencecheck run --shard K/N`` runs the K-th part of the job list,
``fencecheck mutants --shard K/N`` the K-th part of the mutant list (and a
later ``explore`` can take the same function). The split depends only on the
items, their keys and their expected costs, never on the clock, the host, a
hash seed or the order a directory listing happens to give: the same job list
gives the same split on every machine, so ``fencecheck merge`` can tell
exactly which items an absent shard would have run.

Balancing is greedy longest-first (each item, most expensive first, goes to
the shard with the least expected cost so far; ties by key and by shard
number), which keeps the slowest shard within one item's cost of the mean.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from harness.engine.runner import Job

T = TypeVar("T")

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

# Expected cost of one experiment run, in seconds, for balancing only (never
# a timeout). Measured on the 2-core development machine with 3 experiments
# at a time: outside natural waits an experiment spends about 3 s on its own
# database, proxies, mock tool and workers; one that needs replication also
# brings up its own primary and standby, about 4 s more (H: 6.6-8.1 s).
EXPERIMENT_SETUP_S = 3.0
REPLICATED_PAIR_S = 4.0
# A mutant's run also starts its own shared services (primary, toxiproxy).
MUTANT_SERVICES_S = 3.0


class ShardError(ValueError):
    """A shard specification that cannot be honoured; the message says why."""


@dataclass(frozen=True)
class Shard:
    """Part ``index`` (1-based) of ``count`` parts."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"K/N"`` with 1 <= K <= N; anything else is a ShardError naming the fix."""
        match = _SHARD.match(text)
        if match is None:
            raise ShardError(
                f"--shard {text!r} is not K/N; give the part and the number of parts, "
                "e.g. --shard 2/4 (parts count from 1)"
            )
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 1 <= index <= count:
            raise ShardError(
                f"--shard {text}: the part must be between 1 and the number of parts "
                f"(1/{max(count, 1)} .. {max(count, 1)}/{max(count, 1)}); parts count from 1, "
                "so a Kubernetes completion index i is part i+1"
            )
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def assign(
    items: Sequence[T], count: int, *, key: Callable[[T], str], cost: Callable[[T], float]
) -> list[int]:
    """The shard (1-based) of each item, in item order.

    Deterministic: it depends only on each item's key and cost. Every item
    gets exactly one shard; keys must be unique (they name the items in the
    reports, so two items with one key could not be told apart after a merge).
    """
    keys = [key(item) for item in items]
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise ShardError(f"cannot split: items named twice: {', '.join(twice)}")
    if count < 1:
        raise ShardError(f"cannot split into {count} shards")
    if count > len(items):
        raise ShardError(
            f"cannot split {len(items)} item(s) into {count} shards: a shard would run "
            f"nothing; use at most {len(items)} shards"
        )
    costs = [float(cost(item)) for item in items]
    loads = [0.0] * count
    shard_of = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-costs[i], keys[i])):
        lightest = min(range(count), key=lambda s: (loads[s], s))
        loads[lightest] += costs[i]
        shard_of[i] = lightest + 1
    return shard_of


def pick(
    items: Sequence[T], shard: Shard, *, key: Callable[[T], str], cost: Callable[[T], float]
) -> list[T]:
    """The items of ``shard``, in their original order."""
    shard_of = assign(items, shard.count, key=key, cost=cost)
    return [item for item, s in zip(items, shard_of, strict=True) if s == shard.index]


def job_cost(job: Job) -> float:
    """Expected seconds of one experiment run (see the constants above)."""
    spec = job.spec
    pair = REPLICATED_PAIR_S if spec.replication is not None else 0.0
    return EXPERIMENT_SETUP_S + spec.natural_wait(job.variant) + pair


def job_key(job: Job) -> str:
    return job.label
