"""A file server on 127.0.0.1 for testing remote data paths without the internet.

Serves a folder; ``truncate`` names files whose body is cut short (Content-Length says full size,
the connection closes early) to exercise interrupted-download handling.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path
from typing import Iterator


class _Handler(http.server.SimpleHTTPRequestHandler):
    truncate: set[str] = set()

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):  # noqa: N802
        name = self.path.lstrip("/").split("?")[0]
        if name in self.truncate:
            path = Path(self.directory) / name
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@contextlib.contextmanager
def running(server: http.server.ThreadingHTTPServer) -> Iterator[str]:
    """Serve ``server`` (bound to 127.0.0.1) from a thread; yield its base URL; stop and join on exit."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def serve(folder: Path, truncate: tuple[str, ...] = ()) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT/) of a server for ``folder``; stop it on exit."""
    handler = type("H", (_Handler,), {"truncate": set(truncate)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    with running(server) as url:
        yield url + "/"


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    """Answers ``POST /v1/chat/completions`` with ``reply(request_json)``; records every request."""

    reply = staticmethod(lambda body: "ok")
    fail_first: int = 0
    requests: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        import json

        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length).decode() or "{}")
        self.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.send_error(404)
            return
        if len(self.requests) <= self.fail_first:
            self.send_error(503)
            return
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                               "content": self.reply(body)}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@contextlib.contextmanager
def chat_server(reply=lambda body: "ok", fail_first: int = 0) -> Iterator[tuple[str, list]]:
    """A fake OpenAI-compatible server on 127.0.0.1: yields (base_url ending in /v1, requests)."""
    requests: list = []
    handler = type("C", (_ChatHandler,), {"reply": staticmethod(reply), "fail_first": fail_first,
                                          "requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    with running(server) as url:
        yield f"{url}/v1", requests
