"""uvicorn in a thread of the proxy's stub, with its own event loop (uvloop) and no signal handlers (Triton owns
signals).

HTTP is parsed by httptools (llhttp, in C): with it, at 64 clients the proxy answered 19 % more requests than with
h11 (docs/benchmarks.md, "Proxy overhead"). What llhttp leaves to its caller is checked here: a request line and
headers over max_header_bytes are refused (400), and so is an HTTP/1.1 request without a Host header. The
port is bound before the thread starts, so a busy port fails the model load with a clear message. Headers must
arrive within header_timeout_s of a connection opening, and of each later request's first byte (uvicorn has no such
limit); the body has its own limit in guard.HttpGuard.
"""
import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

START_TIMEOUT_S = 15.0


class BadHeaders(Exception):
    """Raised from a parser callback: httptools stops parsing and uvicorn answers 400 (send_400_response)."""


def guarded_protocol(header_timeout_s, max_header_bytes):
    class GuardedHttpProtocol(HttpToolsProtocol):
        """Per request: headers complete within header_timeout_s of their first byte (slowloris; for every request
        of a keep-alive connection, and for a connection that sends nothing at all), at most max_header_bytes of
        request line and headers, and a Host header in HTTP/1.1 (RFC 9112 3.2)."""

        def connection_made(self, transport):
            super().connection_made(transport)
            self.refusal, self.header_deadline = None, None
            self.expect_headers()

        def expect_headers(self):
            self.reading_headers, self.header_bytes = True, 0
            if self.header_deadline is None:
                self.header_deadline = self.loop.call_later(header_timeout_s, self.headers_overdue)

        def on_message_begin(self):
            super().on_message_begin()
            self.expect_headers()

        def on_url(self, url):
            self.count(len(url))
            super().on_url(url)

        def on_header(self, name, value):
            self.count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def count(self, size):
            self.header_bytes += size
            if self.header_bytes > max_header_bytes:
                self.refusal = f"request line and headers over {max_header_bytes} bytes (setting max_header_bytes)"
                raise BadHeaders(self.refusal)

        def on_headers_complete(self):
            self.reading_headers = False
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None
            if self.parser.get_http_version() == "1.1" and not any(name == b"host" for name, _ in self.headers):
                self.refusal = "an HTTP/1.1 request needs a Host header"
                raise BadHeaders(self.refusal)
            super().on_headers_complete()

        def data_received(self, data):
            continuing, counted = self.reading_headers and self.header_bytes > 0, self.header_bytes
            super().data_received(data)
            # llhttp buffers a header line until it ends, uncounted until then: a read that ends no line of headers
            # begun earlier counts whole, so a header line that never ends is bounded too.
            if continuing and self.reading_headers and self.header_bytes == counted and \
                    not self.transport.is_closing():
                try:
                    self.count(len(data))
                except BadHeaders:
                    self.send_400_response(self.refusal)

        def send_400_response(self, msg):
            super().send_400_response(self.refusal or msg)

        def headers_overdue(self):
            self.header_deadline = None
            if self.reading_headers and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc):
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None
            super().connection_lost(exc)

    return GuardedHttpProtocol


class Server:
    def __init__(self, app, settings, log=print):
        self.app, self.settings, self.log = app, settings, log
        self.server = self.thread = self.socket = None

    def bind(self):
        host, port = self.settings.host, self.settings.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets; without it, a response written as
        # headers + body waits ~40 ms for the client's delayed ACK (Nagle).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; a listener still wins
        try:
            sock.bind((host, port))
        except OSError as error:
            sock.close()
            raise RuntimeError(f"proxy: cannot listen on {host}:{port} ({error.strerror}); set PROXY_PORT or the "
                               f"'port' parameter to a free port") from None
        sock.listen(2048)
        return sock

    def start(self):
        self.socket = self.socket or self.bind()
        config = uvicorn.Config(self.app, lifespan="off", log_level="warning", access_log=False,
                                http=guarded_protocol(self.settings.header_timeout_s,
                                                     self.settings.max_header_bytes),
                                timeout_keep_alive=self.settings.keep_alive_s,
                                timeout_graceful_shutdown=self.settings.shutdown_grace_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.serve, name="proxy-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("proxy: the HTTP server did not start (see the log above)")
            time.sleep(0.01)

    def serve(self):
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_default_executor(ThreadPoolExecutor(4, thread_name_prefix="proxy-admin"))
        try:
            loop.run_until_complete(self.server.serve(sockets=[self.socket]))
        except Exception as error:  # noqa: BLE001 - logged; the readiness thread starts a new one
            self.log(f"proxy: HTTP server stopped: {error!r}")
        finally:
            loop.close()

    def alive(self):
        return self.thread is not None and self.thread.is_alive()

    def restart(self):
        if self.socket is not None:  # uvicorn closed it on its way out
            self.socket.close()
            self.socket = None
        self.start()

    def stop(self):
        """Stop accepting, let requests in flight finish for up to shutdown_grace_s, then close."""
        server, thread = self.server, self.thread
        self.thread = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(self.settings.shutdown_grace_s + 2.0)
            if thread.is_alive():
                server.force_exit = True
                thread.join(2.0)
        if self.socket is not None:
            self.socket.close()
            self.socket = None
