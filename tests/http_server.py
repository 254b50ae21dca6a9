"""A local HTTP server for the download tests: no internet needed, and faults on demand.

Used by tests/common/test_download.py, tests/common/test_hub.py and tests/datasets/test_datasets.py.
"""

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    """Serves the bytes in `files` by URL path; `redirects` maps a path to (location, extra headers).

    honour_range=False behaves like a server without Range support; drop_after=N sends only the
    first N bytes of a body (with the full Content-Length) and then closes the connection.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.redirects: dict[str, tuple[str, dict[str, str]]] = {}
        self.honour_range = True
        self.drop_after: int | None = None
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                server.answer(self, send_body=False)

            def do_GET(self):
                server.answer(self, send_body=True)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def answer(self, request: BaseHTTPRequestHandler, send_body: bool) -> None:
        path, range_header = request.path, request.headers.get("Range")
        self.requests.append((request.command, path, range_header))
        if path in self.redirects:
            location, extra = self.redirects[path]
            request.send_response(302)
            request.send_header("Location", location)
            for key, value in extra.items():
                request.send_header(key, value)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        if path not in self.files:
            request.send_error(404)
            return
        body, status = self.files[path], 200
        if range_header and self.honour_range:
            start = int(range_header.removeprefix("bytes=").removesuffix("-"))
            if start >= len(body):
                request.send_error(416)
                return
            request.send_response(206)
            request.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            body, status = body[start:], 206
        else:
            request.send_response(status)
        for key, value in self.headers.get(path, {}).items():
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        if send_body:
            request.wfile.write(body if self.drop_after is None else body[: self.drop_after])
            if self.drop_after is not None:
                request.close_connection = True

    def paths_requested(self, method: str = "GET") -> list[str]:
        return [path for m, path, _ in self.requests if m == method]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    """A URL on which nothing listens: bind a port, then let it go (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
