"""The admin routes' request and response models (routes.py beside them): load, unload, the seed API's CLIP admin
routes."""
from pydantic import BaseModel, Field

from ..schemas import RequestBody


class ClipModelRequest(RequestBody):
    """Seed API `POST /load_clip_model`, `/unload_clip_model`, `/delete_clip_model`."""
    model_name: str = Field(description="open_clip's model name (ViT-B-32), the HF model_type, or an export id")
    pretrained: str | None = Field(None, description="open_clip's pretrained tag (laion2b_s34b_b79k); none: any")


class ClipAdminResult(BaseModel):
    status: str
    model: str = Field(description="the export's id")
    model_name: str
    pretrained: str | None = None
    seconds: float
    files_kept: bool | None = None
    message: str | None = None


class AdminResult(BaseModel):
    id: str
    status: str
    seconds: float
