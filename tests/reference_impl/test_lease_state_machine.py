"""Rule 1-3 against a model: claim / renew / release / save / expire across
two owners on a real database, with short TTLs and database time.

Near an expiry boundary the database's clock decides; the model accepts
either answer there (``MARGIN``) and then follows what the database did.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from reference_impl import errors as e
from reference_impl.leases import Lease
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import cp, new_run

MARGIN = 0.04
OWNERS = ("A", "B")


def test_lease_protocol_matches_model(make_rt: Callable[..., Runtime]) -> None:
    runtimes = {w: make_rt(w) for w in OWNERS}

    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.rt = runtimes
            self.run = new_run(runtimes["A"])
            self.holder: str | None = None
            self.epoch = 0
            self.revision = 0
            self.deadline = 0.0
            self.known: dict[str, Lease] = {}

        def _near(self) -> bool:
            return self.holder is not None and abs(time.monotonic() - self.deadline) < MARGIN

        def _live(self) -> bool:
            return self.holder is not None and time.monotonic() < self.deadline

        @rule(who=st.sampled_from(OWNERS), ttl=st.integers(50, 200))
        def claim(self, who: str, ttl: int) -> None:
            rt = self.rt[who]
            near, live = self._near(), self._live()
            t0 = time.monotonic()
            g = rt.leases.takeover(rt.conn, self.run, rt.owner, ttl)
            if not near:
                assert g.acquired == (not live), g
            if g.acquired:
                assert g.epoch == self.epoch + 1  # every grant is epoch + 1
                self.epoch, self.holder, self.deadline = g.epoch or 0, who, t0 + ttl / 1000
                self.known[who] = g.lease
            else:
                assert g.outcome == "held" and g.epoch == self.epoch

        @rule(who=st.sampled_from(OWNERS), ttl=st.integers(50, 200))
        def renew(self, who: str, ttl: int) -> None:
            lease = self.known.get(who)
            if lease is None:
                return
            rt = self.rt[who]
            mine = self.holder == who and lease.epoch == self.epoch
            near, live = self._near(), self._live()
            t0 = time.monotonic()
            r = rt.leases.renew(rt.conn, lease, ttl)
            if not near or not mine:
                assert r.ok == (mine and live), r
            if r.ok:
                self.deadline = t0 + ttl / 1000

        @rule(who=st.sampled_from(OWNERS))
        def release(self, who: str) -> None:
            lease = self.known.get(who)
            if lease is None:
                return
            rt = self.rt[who]
            out = rt.leases.release(rt.conn, lease)
            mine = self.holder == who and lease.epoch == self.epoch
            assert (out == "released") == mine, out
            if mine:
                self.holder = None

        @rule(who=st.sampled_from(OWNERS))
        def save(self, who: str) -> None:
            lease = self.known.get(who)
            if lease is None:
                return
            rt = self.rt[who]
            mine = self.holder == who and lease.epoch == self.epoch
            near, live = self._near(), self._live()
            try:
                out = rt.writer.write(cp(lease, self.revision))
                ok = True
            except e.LeaseLost:
                ok = False
            if not near or not mine:
                assert ok == (mine and live)
            if ok:
                assert out.revision == self.revision + 1
                self.revision = out.revision

        @rule()
        def expire(self) -> None:
            if self.holder is not None:
                time.sleep(max(0.0, self.deadline - time.monotonic()) + 0.01)

        @invariant()
        def database_agrees(self) -> None:
            row = self.rt["A"].runs.state(self.rt["A"].conn, self.run)
            assert row["epoch"] == self.epoch and row["revision"] == self.revision
            expected_owner = self.rt[self.holder].owner if self.holder else None
            assert row["owner"] == expected_owner

    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=12,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
