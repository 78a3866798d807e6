"""The container backend's images: which ones, and building the derived ones.

No registry is reachable, so nothing is ever pulled unless the user names an
image of their own. Two base images come from ``make containers-setup``
(:mod:`harness.backends.containers_setup`): ``localhost/fencecheck/postgres:latest``
(the default PostgreSQL image) and ``localhost/fencecheck/python:latest``.
The mock tool and toxiproxy images are derived from the python one here, on
demand, through the engine's build API (a ``COPY`` only, about a second):

* ``localhost/fencecheck/mock-tool:<digest>``: this repository's
  ``mock_tool`` package; the tag is a digest of its sources, so an edited
  package gets a new image and a stale one is never used.
* ``localhost/fencecheck/toxiproxy:<digest>``: the toxiproxy-server binary
  the local backend would run (``harness.parts.toxiproxy.find_toxiproxy_server``),
  tagged by the binary's digest. The binary is dynamically linked against
  glibc, hence a Debian base rather than ``scratch``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors

from harness.backends.containers_setup import PG_IMAGE as DEFAULT_PG_IMAGE
from harness.backends.containers_setup import PYTHON_IMAGE as DEFAULT_PYTHON_IMAGE
from harness.parts.toxiproxy import find_toxiproxy_server

REPO_ROOT = Path(__file__).resolve().parents[2]
PG_IMAGE_ENV = "FENCECHECK_PG_IMAGE"
PYTHON_IMAGE_ENV = "FENCECHECK_PYTHON_IMAGE"
MOCK_TOOL_REPO = "localhost/fencecheck/mock-tool"
TOXIPROXY_REPO = "localhost/fencecheck/toxiproxy"
SETUP_HINT = "run `make containers-setup` (it builds the images locally)"


class ImageMissing(RuntimeError):
    """A required image is not in the engine and cannot be built or pulled."""


def engine(base_url: str, timeout_s: float = 60.0) -> docker.DockerClient:
    """A docker-py client for the engine at ``base_url`` (unix://... or tcp://...)."""
    return docker.DockerClient(base_url=base_url, timeout=int(timeout_s))


def pg_image() -> str:
    return os.environ.get(PG_IMAGE_ENV) or DEFAULT_PG_IMAGE


def python_image() -> str:
    return os.environ.get(PYTHON_IMAGE_ENV) or DEFAULT_PYTHON_IMAGE


def has_image(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def image_id(client: docker.DockerClient, name: str) -> str:
    return str(client.images.get(name).id)


def ensure_pg_image(client: docker.DockerClient) -> str:
    """The PostgreSQL image to run; a user-named image is pulled once if missing."""
    name = pg_image()
    if has_image(client, name):
        return name
    if name == DEFAULT_PG_IMAGE:
        raise ImageMissing(f"the default PostgreSQL image {name} is not built: {SETUP_HINT}")
    try:
        client.images.pull(name)
    except docker.errors.APIError as exc:
        raise ImageMissing(
            f"${PG_IMAGE_ENV}={name} is not in the engine and could not be pulled "
            f"({exc.explanation or exc}); load or build it first, or unset {PG_IMAGE_ENV} to "
            f"use the locally built {DEFAULT_PG_IMAGE} ({SETUP_HINT})"
        ) from exc
    return name


def _digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:12]


def _mock_tool_files() -> list[tuple[str, bytes]]:
    package = REPO_ROOT / "mock_tool"
    return [
        (f"mock_tool/{p.name}", p.read_bytes())
        for p in sorted(package.iterdir())
        if p.is_file() and (p.suffix == ".py" or p.name == "py.typed")
    ]


def _context(files: list[tuple[str, bytes, int]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_image(
    client: docker.DockerClient,
    tag: str,
    files: list[tuple[str, bytes, int]],
    *,
    network_mode: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Build ``tag`` from ``files`` (a Dockerfile among them, ``FROM`` the python
    base image); ImageMissing with the build's own error when it fails."""
    base = python_image()
    if not has_image(client, base):
        raise ImageMissing(f"the base image {base} is not built: {SETUP_HINT}")
    try:
        # The low-level call: the high-level one parses the stream for a
        # "Successfully built" line whose form differs between engines.
        stream = client.api.build(
            fileobj=_context(files),
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            network_mode=network_mode,
            labels={"org.fencecheck.derived-from": base},
        )
        log: list[str] = []
        for chunk in stream:
            if "error" in chunk:
                raise ImageMissing(f"building {tag} failed: {chunk['error']}")
            log.append(str(chunk.get("stream", "")))
            if on_line is not None and log[-1].strip():
                on_line(log[-1].rstrip())
    except docker.errors.APIError as exc:
        raise ImageMissing(f"building {tag} failed: {exc.explanation or exc}") from exc
    if not has_image(client, tag):
        raise ImageMissing(f"building {tag} produced no image; build log:\n{''.join(log)[-2000:]}")


#: Digests of one derived image kept besides the current one: another checkout
#: on the same machine (another branch, a CI clone) may still run an older one.
KEEP_OLDER_DIGESTS = 3


def _prune_old(client: docker.DockerClient, repo: str, keep: str) -> None:
    """Remove the digests of one derived image older than the newest
    :data:`KEEP_OLDER_DIGESTS` others (best effort; in-use ones stay)."""
    with contextlib.suppress(docker.errors.APIError):
        others = [
            image
            for image in client.images.list(name=repo)
            if any(t.startswith(repo + ":") for t in image.tags) and keep not in image.tags
        ]
        others.sort(key=lambda image: str(image.attrs.get("Created", "")), reverse=True)
        for image in others[KEEP_OLDER_DIGESTS:]:
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image.id)


def mock_tool_tag() -> str:
    return f"{MOCK_TOOL_REPO}:{_digest(_mock_tool_files())}"


def ensure_mock_tool_image(client: docker.DockerClient) -> tuple[str, bool]:
    """(tag, built now) of the mock tool image for the current sources."""
    tag = mock_tool_tag()
    if has_image(client, tag):
        return tag, False
    files: list[tuple[str, bytes, int]] = [(n, d, 0o644) for n, d in _mock_tool_files()]
    dockerfile = (
        f"FROM {python_image()}\n"
        "COPY mock_tool /opt/fencecheck/mock_tool\n"
        "ENV PYTHONPATH=/opt/fencecheck PYTHONUNBUFFERED=1\n"
        "EXPOSE 8000\n"
        'ENTRYPOINT ["python3", "-m", "mock_tool.server"]\n'
    )
    files.append(("Dockerfile", dockerfile.encode(), 0o644))
    build_image(client, tag, files)
    _prune_old(client, MOCK_TOOL_REPO, tag)
    return tag, True


def toxiproxy_tag(binary: Path | None = None) -> str:
    path = binary or find_toxiproxy_server()
    return f"{TOXIPROXY_REPO}:{_digest([('toxiproxy-server', path.read_bytes())])}"


def ensure_toxiproxy_image(
    client: docker.DockerClient, binary: str | Path | None = None
) -> tuple[str, bool]:
    """(tag, built now) of the toxiproxy image holding the binary the harness found."""
    path = find_toxiproxy_server(binary)
    tag = toxiproxy_tag(path)
    if has_image(client, tag):
        return tag, False
    data = path.read_bytes()
    dockerfile = (
        f"FROM {python_image()}\n"
        "COPY toxiproxy-server /usr/local/bin/toxiproxy-server\n"
        "EXPOSE 8474\n"
        'ENTRYPOINT ["toxiproxy-server"]\n'
    )
    build_image(
        client,
        tag,
        [("toxiproxy-server", data, 0o755), ("Dockerfile", dockerfile.encode(), 0o644)],
    )
    _prune_old(client, TOXIPROXY_REPO, tag)
    return tag, True


def describe(client: docker.DockerClient, names: dict[str, str]) -> dict[str, Any]:
    """name and id of each image, for the evidence's deployment record."""
    out: dict[str, Any] = {}
    for role, name in names.items():
        try:
            out[role] = {"name": name, "id": image_id(client, name)}
        except docker.errors.APIError:
            out[role] = {"name": name, "id": None}
    return out
