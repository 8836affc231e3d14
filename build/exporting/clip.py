"""CLIP exports: open_clip models (architecture + pretrained tag or checkpoint file) and Hugging Face CLIP folders,
as a text tower behind the tokenizer model and an image tower behind the image preprocessing model."""
import glob
import importlib.util
import os
import sys

_TORCHVISION_SCHEMAS = []  # the Library that defines them must stay alive, or the schemas go with it


def import_open_clip():
    """open_clip, importable beside the project's CPU torch. PyPI's torchvision is a CUDA build: its compiled ops
    (_C.so) do not load without libtorch_cuda.so. open_clip uses only torchvision's Python transforms, which do not
    need them; but importing torchvision registers fake kernels for nms and qnms, which needs those ops' schemas.
    So: load the compiled ops when they load, else define the two schemas, then import."""
    import torch

    if "torchvision" not in sys.modules and not _TORCHVISION_SCHEMAS:
        spec = importlib.util.find_spec("torchvision")
        libraries = glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")) if spec else []
        try:
            torch.ops.load_library(libraries[0])
        except (IndexError, OSError):
            schemas = torch.library.Library("torchvision", "DEF")
            for op in ("nms", "qnms"):
                schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _TORCHVISION_SCHEMAS.append(schemas)
    import open_clip

    return open_clip
