"""Requests to the app's plain routes, handed to their functions without FastAPI's request pipeline.

Per query, FastAPI's layers (five middlewares, matching the path against every route twice, solving the route's
dependencies) took ~60 % of the app's CPU (bench/TUNING.md, "The proxy's direct routes"). A route is plain when its
path has no parameters, its function takes the Request, optional query parameters and at most one body (a pydantic
model or a list of them), and its dependencies are `async def (request)` gates. Its request is handled here with the
same parts FastAPI would use: the body parsed and validated by bodies.py (the same pydantic type), errors as
RequestValidationError with FastAPI's locations, and the app's own exception handlers. Every route that takes a body
is plain (a router holding one that is not is refused), so every body is read one way: bodies.py's. Everything else
(path parameters, 404, 405, HEAD, /openapi.json) goes to FastAPI, which also keeps describing every route in the
OpenAPI schema.
"""
import inspect
import sys
import traceback
import typing

from fastapi import Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter
from starlette.responses import PlainTextResponse, Response

from model_library.model_errors import ErrorKind

from . import bodies
from .errors import status


def model_body(annotation):
    """A pydantic model or a list of them: what FastAPI reads from the body."""
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def plain_route(route):
    """(endpoint's Request parameter names, its query parameters [(name, TypeAdapter, default)], body parameter name
    or None, body TypeAdapter or None), or None when the route needs FastAPI (path parameters, a required, constrained
    or aliased query parameter, a body of another type, a dependency that is not a gate)."""
    if not isinstance(route, APIRoute) or route.param_convertors:
        return None
    requests, queries, body, adapter = [], [], None, None
    for name, parameter in inspect.signature(route.endpoint).parameters.items():
        query = parameter.default
        if parameter.annotation is Request:
            requests.append(name)
        elif isinstance(query, params.Query) and not (query.is_required() or query.metadata) and \
                query.alias in (None, name):
            queries.append((name, TypeAdapter(parameter.annotation), query.default))
        elif body is None and model_body(parameter.annotation) and parameter.default is inspect.Parameter.empty:
            body, adapter = name, TypeAdapter(parameter.annotation)
        else:
            return None
    for depends in route.dependencies:
        if not inspect.iscoroutinefunction(depends.dependency) or \
                [p.annotation for p in inspect.signature(depends.dependency).parameters.values()] != [Request]:
            return None
    return requests, queries, body, adapter


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
            if plain is None and getattr(route, "body_field", None) is not None:
                raise ValueError(f"direct routes: {route.path} takes a body but needs FastAPI's pipeline: every body "
                                 f"goes one way (bodies.py)")
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
        route, requests, queries, body_name, adapter = found
        scope["app"], scope["route"] = self.app, route  # request.app; the route's label in the metrics
        request = Request(scope, receive)
        try:  # FastAPI's order: the body parsed, the gates, the parameters validated, the function
            body = await bodies.json(request) if body_name is not None else bodies.NO_BODY
            for depends in route.dependencies:
                await depends.dependency(request)
            response = await route.endpoint(**self.arguments(request, requests, queries, body_name, adapter, body))
            if not isinstance(response, Response):  # FastAPI would serialize it; these routes answer Responses
                raise TypeError(f"{route.path} returned a {type(response).__name__}, not a Response")
        except Exception as error:  # noqa: BLE001 - answered as FastAPI would: the app's handler, else 500
            handle = self.handler(error)
            if handle is None:
                await PlainTextResponse("Internal Server Error", status(ErrorKind.INTERNAL))(scope, receive, send)
                traceback.print_exception(error, file=sys.stderr)
                return None
            response = await handle(request, error)
        return await response(scope, receive, send)

    @staticmethod
    def arguments(request, requests, queries, body_name, adapter, body):
        """The function's arguments, or FastAPI's RequestValidationError: every query parameter's errors, then the
        body's."""
        arguments, errors = dict.fromkeys(requests, request), []
        for name, query, default in queries:
            value = request.query_params.get(name)  # (the last one given, as FastAPI takes a scalar)
            arguments[name], wrong = (default, []) if value is None else bodies.checked(query, value, ("query", name))
            errors += wrong
        if body_name is not None:
            try:
                arguments[body_name] = bodies.validated(body, adapter)
            except RequestValidationError as error:
                errors += error.errors()
        if errors:
            raise RequestValidationError(errors, body=None if body is bodies.NO_BODY else body)
        return arguments
