"""The baseline direct.py is measured and checked against (bench/proxy_app.py, tests/test_proxy_app.py): the proxy's
app with every request through FastAPI's pipeline, behind the same gate and metrics. Never imported by the served app
(model.py, app.py: tests/test_proxy_app.py checks): there every route with a body is direct.py's, so FastAPI's
pipeline parses no body; here it parses every one, the way bodies.py does (OrjsonRoute), so that the two apps differ
only by the pipeline."""
import inspect

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute

from . import app, bodies
from .guard import HttpGuard
from .metrics import MetricsMiddleware

# add_api_route's parameters, each read back from the route's attribute of the same name
ROUTE_FIELDS = [name for name in inspect.signature(APIRouter.add_api_route).parameters
                if name not in ("self", "route_class_override")]


class OrjsonRequest(Request):
    """A body parsed as bodies.py parses it, where FastAPI's pipeline reads one."""

    async def json(self):
        if not hasattr(self, "_json"):
            self._json = bodies.loads(await self.body())
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request):
            return await handler(OrjsonRequest(request.scope, request.receive))
        return handle


def through_fastapi(routes):
    """The same routes (their functions, gates, types and OpenAPI documentation), each an OrjsonRoute."""
    rebuilt = APIRouter(route_class=OrjsonRoute)
    for route in routes.routes:
        rebuilt.add_api_route(**{name: getattr(route, name) for name in ROUTE_FIELDS if hasattr(route, name)})
    return rebuilt


def create_baseline_app(settings, service, metrics):
    """app.create_server_app's app, untraced, with every request through FastAPI's pipeline instead of direct.py."""
    fastapi_app = app.create_app(settings, service, metrics, through_fastapi(app.router))
    return MetricsMiddleware(HttpGuard(fastapi_app, settings, service), metrics, fastapi_app)
