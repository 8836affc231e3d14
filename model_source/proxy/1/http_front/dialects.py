"""The HTTP API's dialects, one router each: every dialect's routes.py (openai/, seed/, cohere/, tei/, admin/,
server/) makes its router here (`router(name, shape)`), and what the rest of the proxy needs to know of them is read
from those routers, never listed again: which error shape a path answers in (shape: a dialect's own, TEI's on TEI's
paths whatever the body, Cohere's on Cohere's, else OpenAI's; also for the gate's refusals before any routing) and
which paths are the admin's (admin: the gate admits no work for them)."""
from fastapi import APIRouter

ROUTERS = {}  # dialect -> its router, in the order the dialects' routes.py modules were imported
SHAPES = {}  # dialect -> its error shape (errors.response), for the dialects that have their own; else OpenAI's


def router(name, shape="openai"):
    """The router of dialect `name` (its routes are tagged with it in the OpenAPI document), its errors in `shape`."""
    if name in ROUTERS:
        raise ValueError(f"dialect {name!r} has a router already")
    made = ROUTERS[name] = APIRouter(tags=[name])
    if shape != "openai":
        SHAPES[name] = shape
    return made


def speaks(path, names=None):
    """The dialect whose router has a route for `path` (any method), the first of `names` (default: all); None:
    no route has it."""
    for name in names or ROUTERS:
        if name in ROUTERS and any(route.path_regex.match(path) for route in ROUTERS[name].routes):
            return name
    return None


def shape(scope):
    """The error shape a request's answer takes: its path's dialect's, whatever the body."""
    return SHAPES.get(speaks(scope.get("path", ""), list(SHAPES)), "openai")


def admin(path):
    return speaks(path, ["admin"]) == "admin"
