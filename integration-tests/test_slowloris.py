"""Slowloris: 2,000 half-open connections that send part of a request line and never finish
must not keep the server from answering others, and the server closes each of them once
--http-header-timeout-s has passed."""
import socket
import time

import requests

from conftest import SERVER_ARGS, launch

IDLE_CONNECTIONS = 2000
# Long enough that the connections are still open when the normal request is made (opening
# 2,000 takes seconds on a busy 2-core machine), short enough to wait for their closing.
HEADER_TIMEOUT_S = 10


def open_half_requests(url: str, count: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: slow")
        sockets.append(sock)
    return sockets


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_half_open_connections_neither_block_others_nor_stay_open(tmp_path):
    args = [*SERVER_ARGS, "--max-total-tokens", "64", "--http-header-timeout-s", str(HEADER_TIMEOUT_S)]
    with launch(tmp_path, args) as server:
        started = time.monotonic()
        sockets = open_half_requests(server.url, IDLE_CONNECTIONS)
        opened_s = time.monotonic() - started
        try:
            asked = time.monotonic()
            body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
            response = requests.post(f"{server.url}/generate", json=body, timeout=30)
            answered_s = time.monotonic() - asked
            assert response.status_code == 200, response.text
            assert answered_s < 5, f"a normal request took {answered_s:.1f} s behind the idle connections"
            assert server.get("/health")[0] == 200
            held = server.metric("superinfer_http_connections")
            assert held >= IDLE_CONNECTIONS // 2, f"only {held:.0f} connections were open during the request"
            # Each one is closed once the header timeout has passed (measured from its connect).
            deadline = started + opened_s + HEADER_TIMEOUT_S + 10
            still_open = [
                sock for sock in sockets
                if not closed_by_server(sock, max(0.01, deadline - time.monotonic()))
            ]
            print(f"\n{IDLE_CONNECTIONS} half-open connections opened in {opened_s:.1f} s; "
                  f"a request answered in {answered_s * 1000:.0f} ms with {held:.0f} connections open; "
                  f"{len(still_open)} left open after the timeout")
            assert not still_open, f"{len(still_open)} half-open connections were never closed"
            # Only this probe's connection and a few just closed by their clients remain.
            assert server.metric("superinfer_http_connections") < 10
        finally:
            for sock in sockets:
                sock.close()
