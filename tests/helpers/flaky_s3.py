"""An S3 endpoint that flaps: a proxy on 127.0.0.1 in front of the moto server that answers some
requests with HTTP 503 (S3's ``SlowDown``) instead of passing them on, as S3 does under load.

Every ``every``-th request fails, once: a request (its method, path and query) that failed passes
when it comes again, as S3's throttling passes. With the count alone (every ``every``-th request of
all clients and processes) one request could fail again and again when the processes' requests
happened to interleave in step with the count: up to three times in a row on a loaded 2-core
machine, and a request that fails ``s3.max_attempts`` times is a persistent fault, not a flap.
Whether a run survived then depended on the machine's speed, not on the code under test. pyarrow
also sends a CompleteMultipartUpload again after the AWS SDK's retry of it succeeded (it still sees
the first answer's error: "error embedded in a 200 OK response"); that repeat passes too.

Requests (of ``methods``) whose path contains ``broken`` always fail: a persistent fault on one
object."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class _ProxyHandler(BaseHTTPRequestHandler):
    """One request: answered with ``SlowDown`` when ``proxy`` says so, else passed upstream. Each
    ``FlakyS3`` subclasses it with its own ``proxy``."""

    protocol_version = "HTTP/1.1"
    proxy: FlakyS3

    def log_message(self, *args):  # quiet
        pass

    def _any(self):
        body = self._body()
        url = urlparse(self.path)
        if self.proxy.should_fail(self.command, url.path, url.query):
            self._slow_down()
            return
        self._forward(body)

    def _slow_down(self) -> None:
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(SLOW_DOWN)))
        self.end_headers()
        self.wfile.write(SLOW_DOWN)

    def _forward(self, body: bytes) -> None:
        upstream = self.proxy.upstream
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("host", "transfer-encoding")
        }
        headers["Host"] = upstream.netloc
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        self.send_response(reply.status)
        dropped = ("transfer-encoding", "connection") + (
            () if self.command == "HEAD" else ("content-length",)
        )
        for key, value in reply.getheaders():
            if key.lower() not in dropped:
                self.send_header(key, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    def _body(self) -> bytes:
        """The request's body, with HTTP chunked transfer encoding (the AWS SDK's uploads)
        undone."""
        if "chunked" not in self.headers.get("Transfer-Encoding", ""):
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers
            pass
        return body

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


class FlakyS3:
    def __init__(self, upstream: str, every: int = 0, broken: str | None = None,
                 methods: tuple[str, ...] = ("GET", "HEAD", "PUT", "POST", "DELETE")):
        self.upstream = urlparse(upstream)
        self.every, self.broken, self.methods = every, broken, methods
        self.requests = self.failed = 0
        self._failed_once: set[tuple[str, str, str]] = set()  # requests failed by the count
        self._lock = threading.Lock()
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def should_fail(self, method: str, path: str, query: str = "") -> bool:
        with self._lock:
            self.requests += 1
            if self.broken and self.broken in path and method in self.methods:
                fail = True
            else:
                request = (method, path, query)
                due = bool(self.every and self.requests % self.every == 0)
                fail = due and request not in self._failed_once  # its retry passes
                if fail:
                    self._failed_once.add(request)
            self.failed += fail
            return fail

    def __enter__(self) -> FlakyS3:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
