"""The proxy's gate in front of the routes (HttpGuard)."""
import asyncio

from model_library.model_errors import ErrorKind

from . import admission, bodies, dialects
from .errors import ApiError, response


def released_when_answered(send, request):
    """`send` that closes the request's admission before the last byte of its answer goes out: a client that sends its
    next request as soon as it has the answer must not find its own finished request still counted in flight."""
    async def send_and_release(message):
        if message["type"] == "http.response.body" and not message.get("more_body"):
            request.close()
        await send(message)
    return send_and_release


class HttpGuard:
    """ASGI layer under the metrics: refuses what must never reach a route, and stops work nobody waits for.

    - while shutting down, or while not live (the supervisor is restarting the server): 503 with Retry-After;
    - each inference request's admission.RequestAdmission (its cost, its deadline), which its first Triton call
      admits or refuses with 429 (service.infer: after the route's key and field checks); the admin router's routes
      are not admitted (dialects.admin);
    - the body read (bodies.read: the one content type rule), before any routing: not JSON 415, over max_body_bytes
      413, not received within body_timeout_s 408;
    - a client that leaves before its answer: the route is cancelled (its Triton call's result is dropped), its work
      leaves the gate at once, and the request counts as 499."""

    def __init__(self, app, settings, service):
        self.app, self.settings, self.service = app, settings, service
        self.gate = admission.WorkGate(settings.admission_target_s, settings.max_concurrent_requests,
                                       target_requests=admission.TARGET_REQUESTS,
                                       timeout_s=settings.request_timeout_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):  # probes, metrics, model lists: answered while draining
            return await self.run(scope, receive, send, None)
        if self.service.draining:
            return await self.refuse(scope, send, ApiError("the server is shutting down", ErrorKind.SHUTTING_DOWN))
        live = self.service.live()
        if not live.ok:  # the supervisor restarts this server: a request served now would be cut by the restart
            return await self.refuse(scope, send,
                                     ApiError(f"the server is being restarted ({live.reason})", ErrorKind.RESTARTING))
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.run(scope, receive, send, None)
        headers = dict(scope["headers"])
        try:
            body = await bodies.read(headers, receive, self.settings)
        except ApiError as error:
            return await self.refuse(scope, send, error)
        except ConnectionError:
            return  # client left while sending: nothing to answer
        if dialects.admin(scope["path"]):  # not admitted: an admin action is no inference work
            return await self.run(scope, receive, send, body)
        # Admitted at its first Triton call (service.infer), after the route has checked its key and fields.
        request = admission.RequestAdmission(self.gate, admission.REQUEST_COST + len(body),
                                             self.settings.request_timeout_s)
        admission.begin(request)
        left = False  # (an error raised by the app is answered by the layers above: the client is still there)
        try:
            left = await self.run(scope, receive, released_when_answered(send, request), body)
        finally:
            if left:
                request.abandon()  # its client is gone: its work leaves the gate now (what Triton runs stops at
                # the request's deadline)
            else:
                request.close()  # its cost leaves the gate once its BLS calls have returned too

    async def run(self, scope, receive, send, body):
        """The app, fed the buffered body, in this task; a watcher task cancels it if the client leaves first (one
        task per request fewer than running the app in a task of its own: CPU the proxy pays on every request).
        Returns whether the client left before its answer."""
        if body is None:
            await self.app(scope, receive, send)
            return False
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
        return left[0]

    @staticmethod
    async def refuse(scope, send, error):
        await response(error, dialects.shape(scope))({"type": "http"}, None, send)
