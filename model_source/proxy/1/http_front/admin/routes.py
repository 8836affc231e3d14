"""The admin routes, behind ADMIN_API_KEY (off without it: 403), never admitted as inference work (guard.py reads
this router's paths): POST /v1/models/{id}/load, /unload, and the seed API's CLIP admin routes POST
/load_clip_model, /unload_clip_model, /delete_clip_model. Errors in OpenAI's shape."""
from fastapi import Depends, Request

from model_library.model_errors import ErrorKind

from .. import dialects
from .. import route_helpers as shared
from ..errors import ApiError
from . import schemas

router = dialects.router("admin")
UNKNOWN_MODEL_LABEL = "(unknown)"  # the metrics' model label of an admin request for an id no export has
ADMIN = {"dependencies": [Depends(shared.admin_key)], "response_model": schemas.AdminResult,
         "responses": shared.error_responses("openai", routes="admin")}
CLIP_ADMIN = {**ADMIN, "response_model": schemas.ClipAdminResult}


async def admin(request, model_id, action):
    # model_id takes a hub id's '/'; it is only ever looked up among the exports' cards, never a path. The metrics
    # label is an export's id, or one fixed label for an id no export has (a path, a NUL byte, 10,000 characters)
    found = [c.id for c in request.app.state.service.exports() if model_id in (c.id, c.name)]
    request.scope["state"]["model"] = found[0] if found else UNKNOWN_MODEL_LABEL
    seconds = await getattr(request.app.state.service, action)(model_id)
    return shared.json_response({"id": model_id, "status": f"{action}ed", "seconds": round(seconds, 3)})


@router.post("/v1/models/{model_id:path}/load", **ADMIN)
async def load(request: Request, model_id: str):
    """Admin: load (or reload) an exported model; models already serving keep serving. Needs ADMIN_API_KEY."""
    return await admin(request, model_id, "load")


@router.post("/v1/models/{model_id:path}/unload", **ADMIN)
async def unload(request: Request, model_id: str):
    """Admin: unload a model; its in-flight requests finish first. Needs ADMIN_API_KEY. Its files are removed with
    `python -m exporter.remove_export NAME`, not over HTTP."""
    return await admin(request, model_id, "unload")


def clip_export(request, body):
    """The CLIP export of open_clip's model name (or the HF model_type, or an export id) and pretrained tag (None:
    any), a loaded one first."""
    service = request.app.state.service
    loaded = {c.id for c in service.cards()}
    found = [c for c in service.exports() if c.image and body.model_name in (c.architecture, c.id, c.name)
             and body.pretrained in (None, c.pretrained)]
    if not found:
        what = body.model_name + (f" / {body.pretrained}" if body.pretrained else "")
        command = f"python build/export.py --open-clip {body.model_name} --pretrained " \
                  f"{body.pretrained or '<pretrained>'} --name <name>"
        raise ApiError(f"no CLIP export of {what} in the model repository. The server never exports (its container "
                       f"has no torch): run `{command}` where the export tools are installed, into this model "
                       f"repository, then load it", ErrorKind.MODEL_NOT_FOUND, "model_name")
    card = sorted(found, key=lambda c: c.id not in loaded)[0]
    request.scope["state"]["model"] = card.id
    return card


async def clip_admin(request, body, action, delete=False):
    card = clip_export(request, body)
    seconds = await getattr(request.app.state.service, action)(card.id)
    kept = {"files_kept": True, "message": f"unloaded; files are never removed over HTTP: remove them with `python "
                                           f"-m exporter.remove_export {card.name}`"} if delete else {}
    return shared.json_response({"status": f"{action}ed", "model": card.id, "model_name": body.model_name,
                                 "pretrained": card.pretrained, "seconds": round(seconds, 3), **kept})


@router.post("/load_clip_model", **CLIP_ADMIN)
async def load_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): load the CLIP export of `model_name` (open_clip's, e.g. ViT-B-32) and `pretrained` (e.g.
    laion2b_s34b_b79k; none: any). The server never exports: a missing one is a 404 with the export command."""
    return await clip_admin(request, body, "load")


@router.post("/unload_clip_model", **CLIP_ADMIN)
async def unload_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): unload that CLIP export (a loaded one first)."""
    return await clip_admin(request, body, "unload")


@router.post("/delete_clip_model", **CLIP_ADMIN)
async def delete_clip_model(request: Request, body: schemas.ClipModelRequest):
    """Seed API (admin): unloads the CLIP export; its files stay (never removed over HTTP)."""
    return await clip_admin(request, body, "unload", delete=True)
