"""The server's own routes, in no API's dialect and behind no key: GET /health (ready), /health/live (the probes)
and GET /metrics (Prometheus)."""
from fastapi import Request
from starlette.responses import PlainTextResponse, Response

from . import dialects
from .errors import status

router = dialects.router("server")
NOT_READY, NOT_LIVE = status("model_not_ready"), status("restarting")


@router.get("/health", response_class=PlainTextResponse, responses={NOT_READY: {"description": "not ready"}})
async def health(request: Request):
    """200 `ok` when the default model and everything it needs are ready, else 503 with the reason. Answered from
    state the readiness thread keeps: no inference, never queued behind one. Never needs a key."""
    ok, reason = request.app.state.service.health()
    return PlainTextResponse("ok" if ok else reason, 200 if ok else NOT_READY, {} if ok else {"Retry-After": "1"})


@router.get("/health/live", response_class=PlainTextResponse, responses={NOT_LIVE: {"description": "not alive"}})
async def live(request: Request):
    """200 while the proxy serves and its BLS threads are not stranded on dead stubs (a liveness probe)."""
    ok, reason = request.app.state.service.live()
    return PlainTextResponse("ok" if ok else reason, 200 if ok else NOT_LIVE)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request):
    """Prometheus text for the proxy; Triton's own nv_* metrics are on Triton's metrics port."""
    content, media_type = request.app.state.metrics.render()
    return Response(content, 200, media_type=media_type)
