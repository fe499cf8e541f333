"""wait_for_http: a port answered by another process is refused, not taken for the server just started."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from repro.common.net import wait_for_http


def _health_server(pid: int) -> http.server.ThreadingHTTPServer:
    body = json.dumps({"status": "ok", "pid": pid}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_another_process_on_the_port_is_an_error(child: subprocess.Popen) -> None:
    server = _health_server(pid=child.pid + 1)
    try:
        with pytest.raises(RuntimeError, match="answered by another process"):
            wait_for_http(f"http://127.0.0.1:{server.server_address[1]}/health", 5, child)
    finally:
        server.shutdown()


def test_the_started_process_answering_is_ready(child: subprocess.Popen) -> None:
    server = _health_server(pid=child.pid)
    try:
        wait_for_http(f"http://127.0.0.1:{server.server_address[1]}/health", 5, child)
    finally:
        server.shutdown()
