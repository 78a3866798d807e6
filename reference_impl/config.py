"""Worker settings: the contract's environment variables, overridden by CLI flags."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_TENANT = "00000000-0000-0000-0000-000000000001"


@dataclass(frozen=True)
class Settings:
    dsn: str | None = None
    admin_dsn: str | None = None
    worker_id: str = "worker"
    tenant: str = DEFAULT_TENANT
    tool_url: str | None = None
    broker_url: str | None = None
    lease_ttl_ms: int = 10_000
    heartbeat_ms: int = 2_000
    heartbeat_timeout_ms: int = 1_000
    dispatch_ttl_ms: int = 10_000
    tool_timeout_ms: int = 3_000
    metrics_port: int | None = None
    #: base64 of the 32-byte key that seals sensitive fields at rest.
    data_key: str | None = None
    #: where to write the final metrics at exit (the harness reads it).
    metrics_file: str | None = None
    mutant: str | None = None
    #: run mode refuses to start below this durability mode (none < async < sync).
    require_durability: str | None = None
    #: One worker session: fixed for the process's lifetime.
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def owner(self) -> str:
        return f"{self.worker_id}/{self.session}"

    def check(self) -> None:
        if min(self.lease_ttl_ms, self.heartbeat_ms, self.heartbeat_timeout_ms) <= 0:
            raise ValueError("lease TTL, heartbeat interval and timeout must be > 0 ms")
        # A dispatch claim of no time expires as it is made: refused at start,
        # not at the first tool step after the run was already claimed.
        if self.dispatch_ttl_ms <= 0:
            raise ValueError("FENCECHECK_DISPATCH_TTL_MS must be > 0 ms")
        if self.heartbeat_ms >= self.lease_ttl_ms:
            raise ValueError("the heartbeat interval must be shorter than the lease TTL")
        if self.require_durability not in (None, "none", "async", "sync"):
            raise ValueError("FENCECHECK_REQUIRE_DURABILITY must be none, async or sync")


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    return int(value) if value not in (None, "") else None


def from_env(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from FENCECHECK_* variables; non-None ``overrides`` (CLI flags) win."""
    env = os.environ if env is None else env
    values: dict[str, object] = {
        "dsn": env.get("FENCECHECK_DSN") or None,
        "admin_dsn": env.get("FENCECHECK_ADMIN_DSN") or None,
        "worker_id": env.get("FENCECHECK_WORKER_ID") or "worker",
        "tenant": env.get("FENCECHECK_TENANT") or DEFAULT_TENANT,
        "tool_url": env.get("FENCECHECK_TOOL_URL") or None,
        "broker_url": env.get("FENCECHECK_BROKER_URL") or None,
        "lease_ttl_ms": _int(env, "FENCECHECK_LEASE_TTL_MS"),
        "heartbeat_ms": _int(env, "FENCECHECK_HEARTBEAT_MS"),
        "heartbeat_timeout_ms": _int(env, "FENCECHECK_HEARTBEAT_TIMEOUT_MS"),
        "dispatch_ttl_ms": _int(env, "FENCECHECK_DISPATCH_TTL_MS"),
        "tool_timeout_ms": _int(env, "FENCECHECK_TOOL_TIMEOUT_MS"),
        "metrics_port": _int(env, "FENCECHECK_METRICS_PORT"),
        "metrics_file": env.get("FENCECHECK_METRICS_FILE") or None,
        "data_key": env.get("FENCECHECK_DATA_KEY") or None,
        "mutant": env.get("FENCECHECK_MUTANT") or None,
        "require_durability": env.get("FENCECHECK_REQUIRE_DURABILITY") or None,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = Settings(**{k: v for k, v in values.items() if v is not None})  # type: ignore[arg-type]
    settings.check()
    return settings
