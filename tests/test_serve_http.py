"""What a real `specdec serve` process does below and around the app: malformed HTTP, keys, request ids.

uvicorn's h11 parser refuses malformed requests before any route runs; it used
to answer `400 text/plain`. What must hold (each test can fail), against a
child process on loopback:
- every malformed request (Content-Length -1, `abc` or two values,
  `Transfer-Encoding: gzip, chunked`, a garbage request line, HTTP/1.1 without
  Host) gets one 400 whose body is the JSON error shape, and the connection is
  closed; the server keeps serving;
- keys read from `--api-key-file` are required (none on the command line);
- a client's `X-Request-Id` comes back and is in the log with the status;
  `HEAD /health` answers 200 without a body.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from specdec.serve.process import LOOPBACK, ServerProcess

ARGS = ["--dtype", "fp32", "--method", "plain", "--log-level", "info", "--max-tokens-limit", "8"]
KEY = "key-from-a-file"
WAIT_S = 30.0
BODY = b'{"prompt": "hi", "max_tokens": 1}'
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
MALFORMED = {
    "negative length": POST + b"Content-Length: -1\r\n\r\n" + BODY,
    "length not a number": POST + b"Content-Length: abc\r\n\r\n" + BODY,
    "two lengths": POST + b"Content-Length: 33\r\nContent-Length: 34\r\n\r\n" + BODY,
    "gzip, chunked": POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + BODY,
    "garbage request line": b"HELLO THERE\r\n\r\n",
    "no host": b"GET /health HTTP/1.1\r\n\r\n",
}


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("http-logs")
    (folder / "keys").write_text(f"# the server's keys\n{KEY}\n")
    process = ServerProcess([*ARGS, "--api-key-file", str(folder / "keys")], folder / "server.log").start()
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def exchange(server: ServerProcess, raw: bytes) -> bytes:
    """Send `raw` on a fresh connection; everything the server sends until it closes (bounded)."""
    with socket.create_connection((LOOPBACK, server.port), timeout=WAIT_S) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):  # ends when the server closes the connection
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.slow
@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_http_gets_the_json_error_shape(server, raw):
    head, _, body = exchange(server, raw).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").lower().split("\r\n")
    assert lines[0].startswith("http/1.1 400"), lines
    assert "content-type: application/json" in lines and "connection: close" in lines
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_http"
    assert server.health() is not None  # still serving


@pytest.mark.slow
def test_keys_from_a_file_request_ids_and_head_health(server):
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as http:
        assert http.get("/v1/models").status_code == 401
        reply = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "probe-42"})
        head = http.head("/health")
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "probe-42"
    assert head.status_code == 200 and head.content == b"" and head.headers["x-request-id"]
    assert "request probe-42: GET /v1/models -> 200" in server.log_tail()
