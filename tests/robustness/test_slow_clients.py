"""Slow and idle clients cannot hold the server (conftest: header and body timeouts 2 s, at most
1,000 connections)."""

from __future__ import annotations

import resource
import socket
import time

import httpx
import pytest

from tests.robustness.conftest import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, Server

PARTIAL_CONNECTIONS = 2000
SLACK_S = 1.5
"""Timer granularity and a loaded machine: a connection is closed within its timeout plus this."""


def _is_closed(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:  # reset by the server
        return True


def _open_partial(server: Server, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.create_connection((server.host, server.port), timeout=5)
        sock.sendall(f"GET /healthz?partial={i} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
        socks.append(sock)
    return socks


@pytest.fixture()
def enough_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = PARTIAL_CONNECTIONS + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"open-file limit {hard} is below {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@pytest.mark.usefixtures("enough_descriptors")
def test_healthz_answers_with_2000_partial_connections_open_and_they_are_closed(server: Server) -> None:
    log_before = len(server.log())
    socks = _open_partial(server, PARTIAL_CONNECTIONS)
    opened = time.monotonic()
    try:
        started = time.monotonic()
        response = httpx.get(f"{server.url}/healthz", timeout=5)
        health_s = time.monotonic() - started
        assert response.status_code == 200
        assert health_s < 1.0, health_s
        time.sleep(max(0.0, opened + HEADER_TIMEOUT_S + SLACK_S - time.monotonic()))
        still_open = sum(not _is_closed(s) for s in socks)
    finally:
        for sock in socks:
            sock.close()
    assert still_open == 0
    flood_log = server.log()[log_before:]
    assert "Traceback" not in flood_log
    assert len(flood_log) < 20_000, len(flood_log)  # a few access lines, nothing per connection


def test_a_silent_connection_is_closed_within_the_header_timeout(server: Server) -> None:
    with socket.create_connection((server.host, server.port)) as sock:
        sock.settimeout(HEADER_TIMEOUT_S + SLACK_S)
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < HEADER_TIMEOUT_S + SLACK_S


def test_a_body_shorter_than_declared_is_408_within_the_body_timeout(server: Server) -> None:
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(
            b"POST /plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000000\r\n\r\n{"model":'
        )
        sock.settimeout(BODY_TIMEOUT_S + SLACK_S)
        started = time.monotonic()
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert time.monotonic() - started < BODY_TIMEOUT_S + SLACK_S
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"body_timeout_s" in answer
