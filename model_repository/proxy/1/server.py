"""uvicorn in a thread of the proxy's stub, with its own asyncio loop and no signal handlers (Triton owns signals).

The port is bound before the thread starts, so a busy port fails the model load with a clear message. Headers must
arrive within header_timeout_s of a connection opening, and of each later request's first byte (uvicorn has no such
limit; h11 would wait for ever); the body has its own limit in app.HttpGuard.
"""
import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

START_TIMEOUT_S = 15.0


def header_timeout_protocol(seconds):
    class HeaderTimeoutProtocol(H11Protocol):
        """Closes a connection whose request headers are not complete within `seconds` of their first byte (slowloris),
        for every request of a keep-alive connection (uvicorn's keep-alive timer stops at the first byte of the next
        request, and h11 would wait for ever), and for a connection that sends nothing at all."""

        def connection_made(self, transport):
            super().connection_made(transport)
            self.header_deadline = self.loop.call_later(seconds, self.headers_overdue)

        def data_received(self, data):
            super().data_received(data)
            # h11 is IDLE from a request's first byte until its headers are complete (then SEND_BODY or DONE).
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if waiting and self.header_deadline is None:
                self.header_deadline = self.loop.call_later(seconds, self.headers_overdue)
            elif not waiting and self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

        def headers_overdue(self):
            self.header_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc):
            if self.header_deadline is not None:
                self.header_deadline.cancel()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


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
                                http=header_timeout_protocol(self.settings.header_timeout_s),
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
        loop = asyncio.new_event_loop()
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
