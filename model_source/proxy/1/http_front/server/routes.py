"""The server's own routes, in no API's dialect and behind no key: GET /health (ready), /health/live (the probes)
and GET /metrics (Prometheus)."""
from fastapi import Request
from starlette.responses import PlainTextResponse, Response

from model_library.model_errors import ErrorKind

from .. import dialects
from ..errors import status

router = dialects.router("server")
NOT_READY, NOT_LIVE = status(ErrorKind.MODEL_NOT_READY), status(ErrorKind.RESTARTING)


@router.get("/health", response_class=PlainTextResponse, responses={NOT_READY: {"description": "not ready"}})
async def health(request: Request):
    """200 `ok` when the default model and everything it needs are ready, else 503 with the reason. Answered from
    state the readiness thread keeps: no inference, never queued behind one. Never needs a key."""
    health = request.app.state.service.health()
    return PlainTextResponse(health.reason, 200 if health.ok else NOT_READY, {} if health.ok else {"Retry-After": "1"})


@router.get("/health/live", response_class=PlainTextResponse, responses={NOT_LIVE: {"description": "not alive"}})
async def live(request: Request):
    """200 while the proxy serves and its BLS threads are not stranded on dead stubs (a liveness probe)."""
    live = request.app.state.service.live()
    return PlainTextResponse(live.reason, 200 if live.ok else NOT_LIVE)


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request):
    """Prometheus text for the proxy; Triton's own nv_* metrics are on Triton's metrics port."""
    content, media_type = request.app.state.metrics.render()
    return Response(content, 200, media_type=media_type)
