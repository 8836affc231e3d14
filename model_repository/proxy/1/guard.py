"""The proxy's gate in front of the routes (HttpGuard)."""
import asyncio
import time

from admission import REQUEST_COST, WorkGate
from http_errors import ApiError, dialect

ADMIN_PATHS = ("/v1/models/", "/load_clip_model", "/unload_clip_model", "/delete_clip_model")  # not admitted


def released_when_answered(send, ticket):
    """`send` that closes the request's ticket before the last byte of its answer goes out: a client that sends its
    next request as soon as it has the answer must not find its own finished request still counted in flight."""
    async def send_and_release(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            ticket.close()
        await send(message)
    return send_and_release


class HttpGuard:
    """ASGI layer under the metrics: refuses what must never reach a route, and stops work nobody waits for.

    - while shutting down, or while not live (the supervisor is restarting the server): 503 with Retry-After;
    - admission control, refused at once with 429 and Retry-After instead of queued into a timeout (admin routes are
      not counted): over max_concurrent_requests inference requests at once, or work in flight that would take over
      admission_target_s to finish (admission.WorkGate; decided from Content-Length, before the body is read);
    - a body that is not JSON: 415 (stops cross-site "simple" POSTs), over max_body_bytes: 413, not received within
      body_timeout_s: 408;
    - a client that leaves before its answer: the route is cancelled (its Triton call's result is dropped) and the
      request counts as 499."""

    def __init__(self, app, settings, service):
        self.app, self.settings, self.service = app, settings, service
        self.admitted = 0  # inference requests in the app now (one event loop: no lock needed)
        self.gate = WorkGate(settings.admission_target_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):  # probes, metrics, model lists: answered while draining
            return await self.run(scope, receive, send, None)
        if self.service.draining:
            return await self.refuse(scope, send, ApiError(503, "the server is shutting down", "shutting_down",
                                                    headers={"Retry-After": "1", "Connection": "close"}))
        live, why = self.service.live()
        if not live:  # the supervisor restarts this server: a request served now would be cut by the restart
            return await self.refuse(scope, send, ApiError(503, f"the server is being restarted ({why})", "restarting",
                                                    headers={"Retry-After": "2", "Connection": "close"}))
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.run(scope, receive, send, None)
        inference = not scope["path"].startswith(ADMIN_PATHS)
        if inference and self.admitted >= self.settings.max_concurrent_requests:
            return await self.refuse(scope, send, ApiError(
                429, f"the server is busy: {self.admitted} requests in progress, the limit is "
                     f"{self.settings.max_concurrent_requests} (setting max_concurrent_requests); retry", "overloaded",
                headers={"Retry-After": "1", "Connection": "close"}))
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        ticket = None
        if inference and declared.isdigit():  # chunked bodies: admitted once their size is known
            ticket = self.gate.admit(REQUEST_COST + int(declared))
            if ticket is None:
                return await self.refuse(scope, send, self.busy(REQUEST_COST + int(declared)))
        self.admitted += inference
        try:
            try:
                body = await self.read_body(headers, receive)
            except ApiError as error:
                return await self.refuse(scope, send, error)
            except ConnectionError:
                return  # client left while sending: nothing to answer
            if inference and ticket is None:
                ticket = self.gate.admit(REQUEST_COST + len(body))
                if ticket is None:
                    return await self.refuse(scope, send, self.busy(REQUEST_COST + len(body)))
            return await self.run(scope, receive, released_when_answered(send, ticket) if ticket else send, body)
        finally:
            self.admitted -= inference
            if ticket is not None:
                ticket.close()  # its cost leaves the gate once its BLS calls have returned too

    def busy(self, cost):
        wait = self.gate.wait_s(cost)  # the same estimate admit() refused on, this request included
        return ApiError(429, f"the server is busy: the work in progress would take {wait:.1f} s to finish, over "
                             f"admission_target_s ({self.settings.admission_target_s:g} s); retry", "overloaded",
                        headers={"Retry-After": "1", "Connection": "close"})

    async def read_body(self, headers, receive):
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        declared = headers.get(b"content-length", b"")
        limit = self.settings.max_body_bytes
        close = {"Connection": "close"}  # refused before its body was read: the connection goes with it
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes (setting max_body_bytes)",
                           "body_too_large", headers=close)
        # No body at all (Content-Length 0, or neither it nor chunked: `curl -X POST .../load`) needs no type.
        empty = declared == b"0" or (not declared and b"transfer-encoding" not in headers)
        if content_type != b"application/json" and not content_type.endswith(b"+json") and not empty:
            raise ApiError(415, "send the body as JSON with 'Content-Type: application/json'",
                           "unsupported_media_type", headers=close)
        chunks, size = [], 0
        deadline = time.monotonic() + self.settings.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise ApiError(408, f"request body not received within {self.settings.body_timeout_s:g} s "
                                    f"(setting body_timeout_s)", "body_timeout", headers=close) from None
            if message["type"] == "http.disconnect":
                raise ConnectionError
            size += len(message.get("body", b""))
            if size > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes (setting max_body_bytes)",
                               "body_too_large", headers=close)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    async def run(self, scope, receive, send, body):
        """The app, fed the buffered body, in this task; a watcher task cancels it if the client leaves first (one
        task per request fewer than running the app in a task of its own: CPU the proxy pays on every request)."""
        if body is None:
            return await self.app(scope, receive, send)
        task, replayed, left, disconnected = asyncio.current_task(), [False], [False], asyncio.Event()

        async def replay():
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            left[0] = True
            disconnected.set()
            task.cancel()  # the client left: stop waiting for its answer (its Triton calls' results are dropped)

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, replay, send)
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - once the client has left, nobody is left to answer
            if not left[0]:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, and it is over
                task.uncancel()
        finally:
            watcher.cancel()

    @staticmethod
    async def refuse(scope, send, error):
        response = error.response(dialect(scope))
        await response({"type": "http"}, None, send)
