"""One-time setup of the container backend: engine, service, images.

Run by ``make containers-setup`` (``python -m harness.backends.containers_setup setup``).
Every step is idempotent: a step whose result is already there is skipped.

1. ``podman``, ``runc`` and ``debootstrap`` are installed with apt-get when
   missing (root only; otherwise the message names the packages).
2. ``.tools/containers/containers.conf`` points podman at runc (the default
   crun cannot set rlimits on this kind of machine) with cgroupfs and a file
   events logger.
3. ``podman system service`` serves the Docker-compatible API on
   ``.tools/containers/podman.sock``; docker-py and testcontainers talk to it.
   Its pid goes to ``.tools/containers/service.pid``; ``service-stop`` signals
   that pid only while it still is this service (a stale file is removed).
4. Images are built locally, since no container registry is reachable:

   * ``localhost/fencecheck/postgres:latest``: ``debootstrap --variant=minbase``
     of the host's Debian release, PostgreSQL from Debian's packages and an
     entrypoint that behaves like the official postgres image's
     (``POSTGRES_HOST_AUTH_METHOD``, ``POSTGRES_USER``, ``POSTGRES_PASSWORD``,
     ``PGDATA``, ``/docker-entrypoint-initdb.d/*.sh``, ``-c`` options);
   * ``localhost/fencecheck/python:latest``: the same base with python3, the
     base of the mock tool and toxiproxy images, which the backend builds on
     demand (see :mod:`harness.backends.containers_images`).

   The apt mirror is the one this machine's apt is configured with. The build
   time of each image is written to ``.tools/containers/build-times.json``.

Subcommands: ``setup`` (all of the above), ``service-start``, ``service-stop``,
``service-status``, ``env`` (shell exports for DOCKER_HOST and friends).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness.waiting import WaitTimeout, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".tools" / "containers"
CONF_PATH = STATE_DIR / "containers.conf"
SOCKET_PATH = STATE_DIR / "podman.sock"
PID_PATH = STATE_DIR / "service.pid"
SERVICE_LOG = STATE_DIR / "service.log"
BUILD_TIMES = STATE_DIR / "build-times.json"

# The base images; harness.backends.containers_images uses them as its defaults.
PG_IMAGE = "localhost/fencecheck/postgres:latest"
PYTHON_IMAGE = "localhost/fencecheck/python:latest"
PACKAGES = ("podman", "runc", "debootstrap")
SERVICE_START_TIMEOUT_S = 20.0
SERVICE_TERM_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
SERVICE_KILL_WAIT_S = 5.0  # after SIGKILL

CONTAINERS_CONF = """\
# Written by `make containers-setup` (harness/backends/containers_setup.py).
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

# Behaves like the official postgres image's entrypoint for what a test
# harness uses; see the module docstring. POSIX sh, no gosu (setpriv).
ENTRYPOINT = r"""#!/bin/sh
# fencecheck's postgres entrypoint: the subset of the official image's
# docker-entrypoint.sh that test harnesses rely on.
set -eu
if [ "${1#-}" != "$1" ]; then set -- postgres "$@"; fi
if [ "$1" != postgres ]; then exec "$@"; fi
: "${PGDATA:=/var/lib/postgresql/data}"
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  chmod 700 "$PGDATA"
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
    echo "error: set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust" >&2
    exit 1
  fi
  pwfile=""
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  fi
  initdb -D "$PGDATA" --username="${POSTGRES_USER:-postgres}" -E UTF8 --locale=C \
    --auth-local=trust --auth-host="$auth" ${pwfile:+--pwfile="$pwfile"} \
    ${POSTGRES_INITDB_ARGS:-} >/dev/null
  [ -z "$pwfile" ] || rm -f "$pwfile"
  printf '\nhost all all all %s\n' "$auth" >> "$PGDATA/pg_hba.conf"
  printf "\nlisten_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
  for f in /docker-entrypoint-initdb.d/*.sh; do
    [ -e "$f" ] || continue
    echo "running $f" >&2
    if [ -x "$f" ]; then "$f"; else . "$f"; fi
  done
fi
exec "$@"
"""


class SetupError(RuntimeError):
    """A setup step failed; the message says which and why."""


def log(msg: str) -> None:
    print(f"containers-setup: {msg}", flush=True)


def _run(argv: list[str], *, what: str, env: dict[str, str] | None = None, **kw: object) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-3000:]
        raise SetupError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF_PATH)}


def docker_host() -> str:
    return f"unix://{SOCKET_PATH}"


# ------------------------------------------------------------------ packages
def ensure_packages() -> None:
    missing = [p for p in PACKAGES if shutil.which(p) is None and not _installed(p)]
    if not missing:
        log(f"packages present: {', '.join(PACKAGES)}")
        return
    if os.geteuid() != 0:
        raise SetupError(
            f"missing {', '.join(missing)}: install them (`sudo apt-get install -y "
            f"{' '.join(PACKAGES)}`) and run `make containers-setup` again"
        )
    log(f"installing {', '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], what="apt-get update", env=env)
    _run(["apt-get", "install", "-y", "-qq", *PACKAGES], what="apt-get install", env=env)


def _installed(package: str) -> bool:
    # debootstrap lives in /usr/sbin, which a non-login PATH may lack.
    return any(Path(d, package).exists() for d in ("/usr/sbin", "/sbin", "/usr/bin"))


def write_conf() -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if CONF_PATH.exists() and CONF_PATH.read_text() == CONTAINERS_CONF:
        return
    CONF_PATH.write_text(CONTAINERS_CONF)
    log(f"wrote {CONF_PATH}")


# ------------------------------------------------------------------- service
def service_alive(timeout_s: float = 2.0) -> bool:
    """The API answers /_ping on our socket."""
    if not SOCKET_PATH.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(SOCKET_PATH))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            return b" 200 " in s.recv(256)
    except OSError:
        return False


def _service_argv(podman: str) -> list[str]:
    """How service_start runs the service; _service_process recognises it by this."""
    return [podman, "system", "service", "--time=0", docker_host()]


def _is_our_service(cmdline: list[str]) -> bool:
    return (
        bool(cmdline)
        and Path(cmdline[0]).name == "podman"
        and cmdline[1:] == _service_argv("podman")[1:]
    )


def _service_process() -> psutil.Process | None:
    """The podman service the pid file names, if that pid still is one.

    A stale pid file (the service died, the machine rebooted) can name a pid
    the kernel gave to an unrelated process since: only a ``podman system
    service`` on this project's socket counts. A stale file is removed.
    """
    try:
        pid = int(PID_PATH.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
    except psutil.ZombieProcess:
        _reap(pid)
        cmdline = []
    except psutil.Error:  # gone, or not ours to look at
        cmdline = []
    if _is_our_service(cmdline):
        return proc
    PID_PATH.unlink(missing_ok=True)
    what = f"is {' '.join(cmdline)!r}" if cmdline else "is not running"
    log(f"removed stale {PID_PATH.name}: pid {pid} {what}, not our podman service")
    return None


def _reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is a child of this process."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _exited(proc: psutil.Process) -> bool:
    _reap(proc.pid)
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def service_start() -> bool:
    """Start ``podman system service`` on our socket; False when it already ran."""
    write_conf()
    if service_alive():
        log(f"podman service already answers on {SOCKET_PATH}")
        return False
    podman = shutil.which("podman")
    if podman is None:
        raise SetupError("podman is not installed: run `make containers-setup`")
    with contextlib.suppress(FileNotFoundError):
        SOCKET_PATH.unlink()
    with open(SERVICE_LOG, "ab") as out:
        proc = subprocess.Popen(
            _service_argv(podman),
            env=podman_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives make; stopped by service-stop
        )
    PID_PATH.write_text(f"{proc.pid}\n")

    def answered() -> str | None:
        if proc.poll() is not None:
            return "exited"
        return "answers" if service_alive() else None

    try:
        outcome = wait_for(
            answered,
            what=f"podman system service (pid {proc.pid}) to answer /_ping on {SOCKET_PATH}",
            timeout_s=SERVICE_START_TIMEOUT_S,
            max_interval_s=0.1,
        )
    except WaitTimeout as exc:
        raise SetupError(f"{exc}; see {SERVICE_LOG}") from exc
    if outcome == "exited":
        raise SetupError(f"podman system service exited with {proc.returncode}; see {SERVICE_LOG}")
    log(f"podman service (pid {proc.pid}) on {SOCKET_PATH}")
    return True


def service_stop() -> None:
    proc = _service_process()
    if proc is None:
        log("no podman service of ours is running")
        return
    pid = proc.pid
    try:
        proc.terminate()  # psutil refuses if the pid was reused meanwhile
        wait_for(
            lambda: _exited(proc),
            what=f"podman service (pid {pid}) to exit after SIGTERM",
            timeout_s=SERVICE_TERM_GRACE_S,
            max_interval_s=0.1,
        )
    except psutil.NoSuchProcess:
        pass
    except WaitTimeout as exc:
        log(f"{exc}; sending SIGKILL")
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
        try:
            wait_for(
                lambda: _exited(proc),
                what=f"podman service (pid {pid}) to exit after SIGKILL",
                timeout_s=SERVICE_KILL_WAIT_S,
                max_interval_s=0.1,
            )
        except WaitTimeout as exc2:
            raise SetupError(f"{exc2}; {PID_PATH} is kept for another try") from exc2
    PID_PATH.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        SOCKET_PATH.unlink()
    log(f"stopped podman service (pid {pid})")


# -------------------------------------------------------------------- images
def image_exists(name: str) -> bool:
    proc = subprocess.run(
        ["podman", "image", "exists", name], env=podman_env(), capture_output=True
    )
    return proc.returncode == 0


def apt_mirror() -> tuple[str, str]:
    """(mirror URL, release codename) as this machine's apt is configured."""
    codename = ""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            codename = line.split("=", 1)[1].strip().strip('"')
    candidates: list[str] = []
    sources = Path("/etc/apt/sources.list.d")
    for path in sorted(sources.glob("*.sources")) if sources.is_dir() else []:
        text = path.read_text()
        for block in text.split("\n\n"):
            if re.search(r"^Suites:.*\b" + re.escape(codename) + r"\b", block, re.M):
                m = re.search(r"^URIs:\s*(\S+)", block, re.M)
                if m and "security" not in m.group(1):
                    candidates.append(m.group(1))
    lists = [Path("/etc/apt/sources.list"), *sorted(sources.glob("*.list"))]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and m.group(2) == codename and "security" not in m.group(1):
                candidates.append(m.group(1))
    if not codename or not candidates:
        raise SetupError(
            "cannot tell the Debian release and apt mirror from /etc/os-release and "
            "/etc/apt/sources.list*; the container images are built with debootstrap from them"
        )
    return candidates[0], codename


def _chroot_apt(rootfs: Path, packages: list[str]) -> None:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C",
    }
    _run(
        ["chroot", str(rootfs), "apt-get", "update", "-qq"], what="apt-get update (image)", env=env
    )
    _run(
        [
            "chroot",
            str(rootfs),
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "-o",
            "Dpkg::Options::=--force-confold",
            *packages,
        ],
        what=f"apt-get install {' '.join(packages)} (image)",
        env=env,
    )
    _run(["chroot", str(rootfs), "apt-get", "clean"], what="apt-get clean (image)", env=env)
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def _import(rootfs: Path, name: str, changes: list[str]) -> None:
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    (rootfs / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
    argv = ["podman", "import"]
    for change in changes:
        argv += ["--change", change]
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
    )
    try:
        proc = subprocess.run(
            [*argv, "-", name], stdin=tar.stdout, env=podman_env(), capture_output=True, text=True
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    if proc.returncode != 0 or tar.returncode != 0:
        raise SetupError(f"podman import of {name} failed: {proc.stderr.strip()[-2000:]}")


def _base_rootfs(work: Path) -> Path:
    mirror, codename = apt_mirror()
    rootfs = work / "base"
    log(f"debootstrap --variant=minbase {codename} (apt mirror of this machine)")
    _run(
        ["debootstrap", "--variant=minbase", codename, str(rootfs), mirror],
        what="debootstrap",
        env={**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    # Services must never start inside the chroot while packages install.
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    shutil.copyfile("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    return rootfs


def build_postgres(base: Path, work: Path) -> None:
    rootfs = work / "postgres"
    _run(["cp", "-a", str(base), str(rootfs)], what="copy base rootfs")
    conf = rootfs / "etc/postgresql-common/createcluster.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("create_main_cluster = false\n")
    _chroot_apt(rootfs, ["postgresql"])
    majors = sorted((rootfs / "usr/lib/postgresql").iterdir(), key=lambda p: int(p.name))
    if not majors:
        raise SetupError("postgresql installed no server under /usr/lib/postgresql")
    bindir = f"/usr/lib/postgresql/{majors[-1].name}/bin"
    entry = rootfs / "usr/local/bin/docker-entrypoint.sh"
    entry.write_text(ENTRYPOINT)
    entry.chmod(0o755)
    (rootfs / "docker-entrypoint-initdb.d").mkdir(exist_ok=True)
    data = rootfs / "var/lib/postgresql/data"
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o1777)  # like the official image: any uid may own PGDATA below it
    path = f"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{bindir}"
    _import(
        rootfs,
        PG_IMAGE,
        [
            f"ENV PATH={path}",
            "ENV PGDATA=/var/lib/postgresql/data",
            "ENV LANG=C.UTF-8",
            f"LABEL org.fencecheck.postgres-major={majors[-1].name}",
            "STOPSIGNAL SIGINT",
            "EXPOSE 5432",
            'ENTRYPOINT ["docker-entrypoint.sh"]',
            'CMD ["postgres"]',
        ],
    )


def build_python(base: Path, work: Path) -> None:
    rootfs = work / "python"
    _run(["cp", "-a", str(base), str(rootfs)], what="copy base rootfs")
    _chroot_apt(rootfs, ["python3"])
    _import(
        rootfs,
        PYTHON_IMAGE,
        [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            "ENV PYTHONDONTWRITEBYTECODE=1",
            'CMD ["python3"]',
        ],
    )


def build_base_images(force: bool = False) -> dict[str, float]:
    """Build the postgres and python images unless present; seconds per built image."""
    todo = [name for name in (PG_IMAGE, PYTHON_IMAGE) if force or not image_exists(name)]
    if not todo:
        log(f"images present: {PG_IMAGE}, {PYTHON_IMAGE}")
        return {}
    times: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="fencecheck-rootfs-"))
    try:
        started = time.monotonic()
        base = _base_rootfs(work)
        times["debootstrap"] = round(time.monotonic() - started, 1)
        for name, build in ((PG_IMAGE, build_postgres), (PYTHON_IMAGE, build_python)):
            if name not in todo:
                continue
            t0 = time.monotonic()
            log(f"building {name}")
            build(base, work)
            times[name] = round(time.monotonic() - t0, 1)
        times["total"] = round(time.monotonic() - started, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return times


def build_tool_images() -> dict[str, float]:
    """The mock tool and toxiproxy images (derived; the backend also builds them on demand)."""
    from harness.backends.containers_images import (
        engine,
        ensure_mock_tool_image,
        ensure_toxiproxy_image,
    )

    client = engine(docker_host())
    times: dict[str, float] = {}
    for what, ensure in (
        ("mock tool", ensure_mock_tool_image),
        ("toxiproxy", ensure_toxiproxy_image),
    ):
        t0 = time.monotonic()
        name, built = ensure(client)
        if built:
            times[name] = round(time.monotonic() - t0, 1)
            log(f"built {what} image {name}")
        else:
            log(f"{what} image present: {name}")
    client.close()
    return times


def record_times(times: dict[str, float]) -> None:
    if not times:
        return
    history = []
    with contextlib.suppress(OSError, ValueError):
        history = json.loads(BUILD_TIMES.read_text())
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": times})
    BUILD_TIMES.write_text(json.dumps(history, indent=2) + "\n")
    log(f"build times (s): {json.dumps(times)} (recorded in {BUILD_TIMES})")


def setup(force_images: bool = False) -> None:
    ensure_packages()
    write_conf()
    started = service_start()
    if started:
        log("the service keeps running for later runs; `make containers-stop` stops it")
    times = build_base_images(force=force_images)
    times.update(build_tool_images())
    record_times(times)
    log("ready; the backend finds the engine at " + docker_host())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.backends.containers_setup")
    parser.add_argument(
        "command",
        choices=("setup", "service-start", "service-stop", "service-status", "env"),
    )
    parser.add_argument("--force-images", action="store_true", help="rebuild the base images")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            setup(force_images=args.force_images)
        elif args.command == "service-start":
            # Exit 0 when this call started it, 3 when it already ran (for make).
            return 0 if service_start() else 3
        elif args.command == "service-stop":
            service_stop()
        elif args.command == "service-status":
            alive = service_alive()
            print("running" if alive else "stopped")
            return 0 if alive else 1
        else:
            print(f"export DOCKER_HOST={docker_host()}")
            print("export TESTCONTAINERS_RYUK_DISABLED=true")
            print("export TESTCONTAINERS_CONNECTION_MODE=docker_host")
    except SetupError as exc:
        print(f"containers-setup: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
