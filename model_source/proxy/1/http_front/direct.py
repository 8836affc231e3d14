"""Requests to the app's plain routes, handed to their functions without FastAPI's request pipeline.

Per query, FastAPI's layers (five middlewares, matching the path against every route twice, solving the route's
dependencies) took ~60 % of the app's CPU (bench/TUNING.md, "The proxy's direct routes"). A route is plain when its
path has no parameters, its function takes the Request and at most one pydantic-model body, and its dependencies
are `async def (request)` gates. Its request is handled here with the same parts FastAPI would use: the body parsed
by orjson, validated by the same pydantic type, errors as RequestValidationError with FastAPI's locations, and the
app's own exception handlers. Everything else (path or query parameters, 404, 405, HEAD, /openapi.json) goes to
FastAPI, which also keeps describing every route in the OpenAPI schema.
"""
import inspect
import json
import sys
import traceback

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.responses import PlainTextResponse, Response

from .errors import status

NO_BODY = object()  # an empty body (a JSON null is None)


def plain_route(route):
    """(endpoint's Request parameter names, body parameter name or None, body TypeAdapter or None), or None when the
    route needs FastAPI (path or query parameters, a non-model body, a dependency that is not a gate)."""
    if not isinstance(route, APIRoute) or route.param_convertors:
        return None
    requests, body, adapter = [], None, None
    for name, parameter in inspect.signature(route.endpoint).parameters.items():
        if parameter.annotation is Request:
            requests.append(name)
        elif body is None and inspect.isclass(parameter.annotation) and issubclass(parameter.annotation, BaseModel) \
                and parameter.default is inspect.Parameter.empty:
            body, adapter = name, TypeAdapter(parameter.annotation)
        else:
            return None
    for depends in route.dependencies:
        if not inspect.iscoroutinefunction(depends.dependency) or \
                [p.annotation for p in inspect.signature(depends.dependency).parameters.values()] != [Request]:
            return None
    return requests, body, adapter


class DirectRoutes:
    """ASGI app in front of a FastAPI app: the plain routes of `routers` (included in the app as they are)
    answered directly, the rest passed on."""

    def __init__(self, app, *routers):
        self.app, self.routes = app, {}
        for router in routers:
            # A router's own prefix or dependencies (an auth gate!) are applied by FastAPI at include time: never
            # skipped.
            if router.prefix or router.dependencies:
                raise ValueError("direct routes: the router must have no prefix and no dependencies of its own")
            self.add(router)

    def add(self, router):
        for route in router.routes:
            plain = plain_route(route)
            if plain is not None:
                for method in route.methods:
                    self.routes[(method, route.path)] = (route, *plain)

    def handler(self, error):
        for kind in type(error).__mro__:
            if kind in self.app.exception_handlers:
                return self.app.exception_handlers[kind]
        return None

    async def __call__(self, scope, receive, send):
        found = self.routes.get((scope.get("method"), scope.get("path"))) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        route, requests, body_name, adapter = found
        scope["app"], scope["route"] = self.app, route  # request.app; the route's label in the metrics
        request = Request(scope, receive)
        try:  # FastAPI's order: the body parsed, the gates, the body validated, the function
            body = await self.json_body(request) if body_name is not None else NO_BODY
            for depends in route.dependencies:
                await depends.dependency(request)
            arguments = dict.fromkeys(requests, request)
            if body_name is not None:
                arguments[body_name] = self.validated(body, adapter)
            response = await route.endpoint(**arguments)
            if not isinstance(response, Response):  # FastAPI would serialize it; these routes answer Responses
                raise TypeError(f"{route.path} returned a {type(response).__name__}, not a Response")
        except Exception as error:  # noqa: BLE001 - answered as FastAPI would: the app's handler, else 500
            handle = self.handler(error)
            if handle is None:
                await PlainTextResponse("Internal Server Error", status("internal"))(scope, receive, send)
                traceback.print_exception(error, file=sys.stderr)
                return None
            response = await handle(request, error)
        return await response(scope, receive, send)

    @staticmethod
    async def json_body(request):
        """The body as FastAPI reads it for a model parameter: NO_BODY when empty, JSON when the content type is
        application/json or */*+json, bytes otherwise (strict content type: validated as bytes, and refused)."""
        body = await request.body()
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not body or not (kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))):
            return body or NO_BODY
        try:
            return orjson.loads(body)
        except json.JSONDecodeError as error:  # orjson's errors are JSONDecodeErrors
            if "surrogate" in error.msg:  # an escaped lone surrogate ("\\ud800") is valid JSON (and FastAPI's parser
                try:  # takes it): parsed so, the route names the field that holds it (`input[3] is not valid
                    return json.loads(body.decode("utf-8"))  # Unicode`). A body not in UTF-8 stays refused.
                except ValueError:  # (UnicodeDecodeError included)
                    pass
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body", error.pos),
                                           "msg": "JSON decode error", "input": {}, "ctx": {"error": error.msg}}],
                                         body=error.doc) from None

    @staticmethod
    def validated(body, adapter):
        if body is NO_BODY:
            raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                           "input": None}])
        try:
            return adapter.validate_python(body, from_attributes=True)
        except ValidationError as error:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)],
                                         body=body) from None
