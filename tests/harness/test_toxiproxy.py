"""The real toxiproxy server and the link faults, against a real TCP echo server."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.parts import ports, toxiproxy
from harness.parts.link_probe import probe
from harness.parts.toxiproxy import (
    FaultActive,
    Link,
    ToxiproxyError,
    ToxiproxyNotFound,
    ToxiproxyServer,
    find_toxiproxy_server,
)
from harness.waiting import wait_for
from tests.harness.helpers import EchoServer, echo_server, pid_alive

IO_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer(tmp_path_factory.mktemp("toxiproxy")) as srv:
        yield srv


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with echo_server() as srv:
        yield srv


@pytest.fixture
def link(
    server: ToxiproxyServer, echo: EchoServer, request: pytest.FixtureRequest
) -> Iterator[Link]:
    link = server.link(request.node.name[:40], echo.address)
    try:
        yield link
    finally:
        link.heal()
        server.client.delete_proxy(link.name)


def roundtrip(link: Link, payload: bytes = b"hello\n") -> bytes:
    with socket.create_connection((link.listen_host, link.listen_port), timeout=IO_TIMEOUT_S) as s:
        s.sendall(payload)
        return s.recv(1024)


def test_server_starts_answers_and_leaves_no_process(tmp_path: Path) -> None:
    with ToxiproxyServer(tmp_path) as srv:
        assert srv.process is not None
        pid = srv.process.pid
        assert srv.version  # /version answered
        assert srv.client.list_proxies() == {}
    assert not pid_alive(pid)
    assert (tmp_path / "toxiproxy.stderr.log").exists() or (
        tmp_path / "toxiproxy.stdout.log"
    ).exists()


def test_proxy_passes_traffic_on_its_real_port(link: Link, echo: EchoServer) -> None:
    assert link.listen_port != 0
    assert link.info().listen == f"127.0.0.1:{link.listen_port}"
    assert roundtrip(link) == b"hello\n"
    assert echo.received == [b"hello\n"]


def test_cut_refuses_and_breaks_connections_then_heal_restores(
    server: ToxiproxyServer, link: Link
) -> None:
    held = socket.create_connection((link.listen_host, link.listen_port), timeout=IO_TIMEOUT_S)
    held.sendall(b"before\n")
    assert held.recv(1024) == b"before\n"
    record = link.cut()
    assert record.kind == "cut" and record.stopped_at is None
    assert record.detail == (
        f"cut link {link.name} (127.0.0.1:{link.listen_port} -> {link.upstream})"
    )
    # The open connection is closed by the proxy: EOF or reset, within the timeout.
    with held:
        try:
            held.sendall(b"during\n")
            assert held.recv(1024) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
    with pytest.raises(ConnectionRefusedError):
        roundtrip(link)
    healed = link.heal()
    assert [r.kind for r in healed] == ["cut"] and healed[0].stopped_at is not None
    assert roundtrip(link, b"after\n") == b"after\n"
    journal = [r for r in server.journal() if r.link == link.name]
    assert [(r.kind, r.stopped_at is not None) for r in journal] == [("cut", True)]


def test_blackhole_silences_and_heal_restores(link: Link) -> None:
    link.blackhole()
    with pytest.raises(TimeoutError):
        roundtrip(link)
    link.heal()
    assert roundtrip(link) == b"hello\n"


def test_drop_responses_lets_requests_reach_the_server(link: Link, echo: EchoServer) -> None:
    link.drop_responses()
    with pytest.raises(TimeoutError):
        roundtrip(link, b"commit\n")
    wait_for(
        lambda: echo.received == [b"commit\n"],
        what="the request to reach the echo server",
        timeout_s=5,
    )
    link.stop("drop_responses")
    assert roundtrip(link, b"again\n") == b"again\n"


def test_reset_peer_resets_connections(link: Link) -> None:
    link.reset()
    with pytest.raises((ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        data = roundtrip(link)
        # Some kernels report the RST as EOF on the first read.
        if data == b"":
            raise ConnectionResetError("EOF")
    link.heal()
    assert roundtrip(link) == b"hello\n"


def test_latency_delays_answers(link: Link) -> None:
    link.latency(300)
    start = time.monotonic()
    assert roundtrip(link) == b"hello\n"
    assert time.monotonic() - start >= 0.25
    link.stop("latency")


def test_second_start_of_an_active_fault_is_refused(link: Link) -> None:
    link.cut()
    with pytest.raises(FaultActive, match="already active"):
        link.cut()
    link.blackhole("upstream")
    with pytest.raises(FaultActive):
        link.blackhole("downstream")
    assert sorted(r.kind for r in link.active()) == ["blackhole", "cut"]
    link.heal()
    assert link.active() == []
    assert link.info().toxics == () and link.info().enabled


def test_http_errors_raise_with_status_and_body(server: ToxiproxyServer, link: Link) -> None:
    with pytest.raises(ToxiproxyError) as duplicate:
        server.client.create_proxy(link.name, link.upstream)
    assert duplicate.value.status == 409
    assert "already exists" in duplicate.value.body
    with pytest.raises(ToxiproxyError) as missing:
        server.client.get_proxy("no_such_proxy")
    assert missing.value.status == 404
    with pytest.raises(ToxiproxyError) as no_toxic:
        server.client.remove_toxic(link.name, "no_such_toxic")
    assert no_toxic.value.status == 404


def test_unreachable_api_raises(tmp_path: Path) -> None:
    client = toxiproxy.ToxiproxyClient("127.0.0.1", ports.free_port(), timeout_s=1.0)
    with pytest.raises(ToxiproxyError) as err:
        client.version()
    assert err.value.status is None


def test_find_server_order_and_missing_binary_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = find_toxiproxy_server()
    monkeypatch.setenv("FENCECHECK_TOXIPROXY", str(real))
    assert find_toxiproxy_server() == real
    with pytest.raises(ToxiproxyNotFound, match="explicit"):
        find_toxiproxy_server(tmp_path / "nope")
    monkeypatch.setenv("FENCECHECK_TOXIPROXY", str(tmp_path / "nope"))
    with pytest.raises(ToxiproxyNotFound, match="FENCECHECK_TOXIPROXY"):
        find_toxiproxy_server()
    monkeypatch.delenv("FENCECHECK_TOXIPROXY")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(toxiproxy, "LOCAL_BINARY", tmp_path / "missing")
    with pytest.raises(ToxiproxyNotFound) as err:
        find_toxiproxy_server()
    assert "make setup" in str(err.value) and "go install" in str(err.value)


def test_heal_all_forgets_deleted_proxies(server: ToxiproxyServer, echo: EchoServer) -> None:
    kept = server.link("heal_all_kept", echo.address)
    gone = server.link("heal_all_gone", echo.address)
    kept.cut()
    server.client.delete_proxy(gone.name)  # behind the server object's back
    assert [r.kind for r in server.heal_all()] == ["cut"]
    assert "heal_all_gone" not in server.links()
    server.remove_link(kept.name)
    assert "heal_all_kept" not in server.client.list_proxies()


# ------------------------------------------------------------ the link probe


def test_probe_tells_every_fault_kind_apart(link: Link, echo: EchoServer) -> None:
    """Each fault as the harness's own probe sees it, on one link in turn."""
    assert probe(link, b"ping\n", wait_s=1).outcome == "answered"
    link.cut()
    assert probe(link, b"ping\n", wait_s=1).outcome == "refused"
    link.heal()
    link.blackhole()
    silent = probe(link, b"ping\n", wait_s=0.3)
    assert silent.outcome == "silent" and silent.elapsed_ms >= 250
    link.heal()
    link.reset()
    assert probe(link, b"ping\n", wait_s=1).outcome in ("reset", "closed")
    link.heal()
    link.latency(300)
    slow = probe(link, b"ping\n", wait_s=2)
    assert slow.outcome == "answered" and slow.elapsed_ms >= 250
    link.heal()


def test_reset_downstream_lets_the_request_reach_the_server(link: Link, echo: EchoServer) -> None:
    link.reset(direction="downstream")
    seen = probe(link, b"acted\n", wait_s=1)
    assert seen.outcome in ("reset", "closed"), seen
    wait_for(
        lambda: b"acted\n" in echo.received,
        what="the request to reach the echo server although its answer was reset",
        timeout_s=5,
    )
    link.heal()
    with pytest.raises(ValueError):
        link.reset(direction="sideways")
    assert "reset" not in {r.kind for r in link.active()}


def test_probe_refuses_a_wait_of_zero(link: Link) -> None:
    with pytest.raises(ValueError):
        probe(link, b"x", wait_s=0)
