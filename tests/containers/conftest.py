"""Container-backend fixtures; every test needing an engine skips without one.

The engine and images come from ``make containers-setup``; ``make test``
stays independent of podman because these tests skip (naming that target)
when no engine answers or the images are missing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.parts.pg_binaries import PgBinaries

if TYPE_CHECKING:
    from harness.backends.containers import ContainerBackend

SETUP = "run `make containers-setup`, then `make test-containers`"


@functools.cache
def engine_problem() -> str | None:
    """None when an engine answers and the base images exist, else why not."""
    try:
        from harness.backends import containers_images as images
        from harness.backends.base import BackendUnavailable
        from harness.backends.containers import find_engine
    except ImportError as exc:
        return f"docker-py/testcontainers missing ({exc})"
    try:
        url = find_engine()
    except BackendUnavailable as exc:
        return str(exc).split(" (")[0]
    client = images.engine(url, timeout_s=10)
    try:
        missing = [
            name
            for name in (images.pg_image(), images.python_image())
            if not images.has_image(client, name)
        ]
    finally:
        client.close()
    return f"images not built: {', '.join(missing)}" if missing else None


def require_engine() -> None:
    problem = engine_problem()
    if problem is not None:
        pytest.skip(f"no container engine set up ({problem}); {SETUP}")


@pytest.fixture(scope="session")
def engine_ready() -> None:
    require_engine()


@pytest.fixture(scope="module")
def backend(engine_ready: None, pg_binaries: PgBinaries) -> Iterator[ContainerBackend]:
    """One backend (network, images) per module; nothing of it is left afterwards."""
    from harness.backends.containers import ContainerBackend

    made = ContainerBackend.create(binaries=pg_binaries)
    try:
        yield made
    finally:
        made.close()
    assert made.leftovers() == [], "close() left containers or networks behind"


@pytest.fixture
def client(engine_ready: None) -> Iterator[Any]:
    """A docker-py client of the engine the backend uses."""
    from harness.backends import containers_images as images
    from harness.backends.containers import find_engine

    made = images.engine(find_engine())
    try:
        yield made
    finally:
        made.close()
