"""Image preprocessing step of a CLIP export: `image` (one encoded image per row: JPEG, PNG, WebP, GIF (its first
frame), anything else Pillow opens but EPS) -> pixel_values [3, H, W] float32, the image tower's input.

The transform is the model's own, described by preprocess.json beside this file (exporter/image_config.py
writes it from open_clip's preprocess or transformers' CLIPImageProcessor, PIL backend) and reproduced with the same
Pillow operations in the same order, so the pixels are the library's:
  1. EXIF orientation applied (ImageOps.exif_transpose): the image as its viewer shows it.
  2. convert_rgb_first (transformers): to RGB, transparency composited onto white (`alpha`: "white"; "drop": plain
     convert("RGB")).
  3. resize: "shortest" with an int resize_size: the shorter side to it, the longer int(size * long / short)
     (torchvision's Resize(int) and transformers' shortest_edge); "shortest" with [h, w]: open_clip's
     ResizeKeepRatio (round(side / min(h_ratio, w_ratio))); "squash": exactly [h, w]. Pillow resizes RGBA and LA
     premultiplied and P (palette) with nearest, which is why the RGB conversion's place matters.
  4. crop "center" to height x width: offset int(round(d / 2)) (torchvision, Python's round: half to even) or
     d // 2 (transformers); a side smaller than the crop is padded with zeros (torchvision: floor(d / 2) before,
     transformers: ceil(d / 2) before).
  5. not convert_rgb_first (open_clip): to RGB after the crop (its MaybeConvertMode), alpha dropped.
  6. per channel (value * rescale - mean) / std in float32 (a 256-entry table per channel).

A bad row (not an image, truncated or corrupt, over max_image_bytes or max_image_pixels, empty, a malformed BYTES
element) fails its request with INVALID_ARG naming the row and the cause; the other requests of the execute are
unaffected. The pixel count is checked from the header, before any pixel is decoded. Settings: config.pbtxt
parameters, read once here.
"""
import io
import json
import os
import re
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, ImageOps, UnidentifiedImageError

sys.dont_write_bytecode = True  # the repository may be read-only storage: no __pycache__ beside it
from model_library import model_common
from model_library.model_outputs import PIXEL_VALUES

RESAMPLING = {mode.name.lower(): mode for mode in Image.Resampling}
BOMB = (Image.DecompressionBombError, Image.DecompressionBombWarning)


InvalidInput = model_common.InvalidInput  # a request's error about one field (model_errors.py's contract)


class Transform:
    """preprocess.json's transform: a PIL image -> [3, height, width] float32."""

    def __init__(self, config):
        self.height, self.width = int(config["height"]), int(config["width"])
        self.resize, self.crop = config.get("resize"), config.get("crop")
        if self.resize not in (None, "shortest", "squash") or self.crop not in (None, "center"):
            raise ValueError(f"resize {self.resize!r} / crop {self.crop!r}: not supported")
        size = config.get("resize_size")
        self.resize_size = size if isinstance(size, int) or size is None else (int(size[0]), int(size[1]))
        if self.resize == "squash" and not isinstance(self.resize_size, tuple):
            raise ValueError("resize squash needs resize_size [h, w]")
        if self.crop is None and (self.resize != "squash" or self.resize_size != (self.height, self.width)):
            raise ValueError("without a crop, the resize must squash to exactly [height, width]")
        self.resample = RESAMPLING[config.get("interpolation", "bicubic")]
        self.floor = config.get("crop_rounding", "round") == "floor"
        self.rgb_first = bool(config.get("convert_rgb_first", False))
        self.white = config.get("alpha", "white" if self.rgb_first else "drop") == "white"
        rescale = config.get("rescale") or 1.0
        mean = np.asarray(config.get("mean") or [0.0] * 3, dtype=np.float32).reshape(3, 1)
        std = np.asarray(config.get("std") or [1.0] * 3, dtype=np.float32).reshape(3, 1)
        # the libraries' arithmetic: value * rescale (transformers: in float64, then float32), then float32 (x-m)/s
        values = (np.arange(256, dtype=np.float64) * rescale).astype(np.float32)[None, :]
        self.table = (values - mean) / std

    def resized_size(self, width, height):
        """(width, height) after the resize step."""
        if self.resize == "squash":
            return self.resize_size[1], self.resize_size[0]
        if self.resize == "shortest" and isinstance(self.resize_size, int):  # torchvision/transformers: int()
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.resize_size, int(self.resize_size * long / short)
            return (new_short, new_long) if width <= height else (new_long, new_short)
        if self.resize == "shortest":  # open_clip's ResizeKeepRatio: Python round()
            ratio = min(height / self.resize_size[0], width / self.resize_size[1])
            return round(width / ratio), round(height / ratio)
        return width, height

    def to_rgb(self, image):
        if image.mode == "RGB":
            return image
        if self.white and ("A" in image.getbands() or image.info.get("transparency") is not None):
            image = image.convert("RGBA")  # transformers' convert_to_rgb: onto a white background
            return Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image).convert("RGB")
        return image.convert("RGB")

    def __call__(self, image):
        if self.rgb_first:
            image = self.to_rgb(image)
        size = self.resized_size(*image.size)
        if size != image.size:  # torchvision skips a resize to the same size (Pillow would copy it)
            image = image.resize(size, self.resample)
        if self.crop == "center":
            width, height = image.size
            top, left = self.offset(height, self.height), self.offset(width, self.width)
            if (top, left, height, width) != (0, 0, self.height, self.width):
                image = image.crop((left, top, left + self.width, top + self.height))  # outside: zeros
        pixels = np.asarray(self.to_rgb(image))
        out = np.empty((3, self.height, self.width), dtype=np.float32)
        for channel in range(3):
            np.take(self.table[channel], pixels[:, :, channel], out=out[channel], mode="clip")
        return out

    def offset(self, size, crop):
        if crop > size:  # padded: torchvision puts floor(d / 2) before, transformers ceil(d / 2)
            return -((crop - size + self.floor) // 2)
        return (size - crop) // 2 if self.floor else int(round((size - crop) / 2.0))


def _parameter(config, key):
    try:
        return config["parameters"][key]["string_value"]
    except KeyError:
        raise pb_utils.TritonModelException(f"config.pbtxt lacks the parameter {key}") from None


class TritonPythonModel:
    def initialize(self, args):
        config, here = model_common.start_model(args)
        with open(os.path.join(here, "preprocess.json"), encoding="utf-8") as handle:
            preprocess = json.load(handle)
        try:
            self.transform = Transform(preprocess)
        except (KeyError, ValueError, TypeError) as error:
            raise pb_utils.TritonModelException(f"preprocess.json: {error!r}") from None
        dims = [int(d) for d in next(o for o in config["output"] if o["name"] == PIXEL_VALUES)["dims"]]
        if dims != [3, self.transform.height, self.transform.width]:
            raise pb_utils.TritonModelException(f"pixel_values dims {dims} in config.pbtxt, preprocess.json says "
                                                f"[3, {self.transform.height}, {self.transform.width}]")
        self.max_bytes = int(_parameter(config, "max_image_bytes"))
        self.max_pixels = int(_parameter(config, "max_image_pixels"))
        # Pillow's own guard at the same limit: it also covers images nested in a file (ICO, ICNS) and GIF frames.
        # Its warning (between 1x and 2x the limit) is for images refused below anyway: silenced, not doubled.
        Image.MAX_IMAGE_PIXELS = self.max_pixels
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        Image.init()
        self.formats = [f for f in Image.ID if f != "EPS"]  # EPS runs Ghostscript, a program, on the input
        threads = int(_parameter(config, "decode_threads"))
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode") if threads > 1 else None

    def pixels(self, item, label):
        """One row's [3, H, W] pixels, or InvalidInput naming the row and the cause."""
        if not isinstance(item, bytes):
            item = bytes(item) if isinstance(item, (bytearray, memoryview)) else str(item).encode()
        if not item:
            raise InvalidInput(label, "is empty")
        if len(item) > self.max_bytes:
            raise InvalidInput(label, f"is {len(item)} bytes, over the limit of {self.max_bytes} (parameter "
                          f"max_image_bytes)")
        try:
            image = Image.open(io.BytesIO(item), formats=self.formats)
        except UnidentifiedImageError:
            raise InvalidInput(label, "is not an image Pillow can read (JPEG, PNG, WebP, GIF, ...)") from None
        width, height = image.size
        if not width or not height:
            raise InvalidInput(label, f"is {width}x{height}: no pixels")
        if width * height > self.max_pixels:
            raise InvalidInput(label, f"is {width}x{height} = {width * height} pixels, over the limit of "
                          f"{self.max_pixels} (parameter max_image_pixels)")
        # EXIF may swap the sides: both ways
        resized = max(self.transform.resized_size(width, height), self.transform.resized_size(height, width),
                      key=lambda size: size[0] * size[1])
        if resized[0] * resized[1] > self.max_pixels:  # a 1x40000 strip resized to 224 high: 224x8960000
            raise InvalidInput(label, f"is {width}x{height}: its aspect ratio would make the resized image "
                          f"{resized[0]}x{resized[1]}, over the limit of {self.max_pixels} pixels (parameter "
                          f"max_image_pixels)")
        try:
            image.load()
        except BOMB:
            raise
        except Exception as error:  # Pillow raises OSError, SyntaxError, ValueError, EOFError... for bad data
            raise InvalidInput(label, f"could not be decoded ({image.format}, {width}x{height}): truncated or "
                          f"corrupt ({type(error).__name__}: {error})") from None
        try:
            ImageOps.exif_transpose(image, in_place=True)
        except Exception:  # unreadable EXIF: the pixels are fine, and the libraries never read it either
            pass
        return self.transform(image)

    def row(self, item, label):
        """pixels(), or the row's InvalidInput (not raised, its frames dropped): a hostile image fails its row, never
        the stub. Why the frames go (model_common.forget_frames): the error's traceback reaches execute()'s frame,
        which holds the error in its results, a cycle that kept the requests, and so the model, alive: the model
        stayed UNLOADING after one bad image (issue 58: the CLIP unload that waited 60 s, then a second stub)."""
        result = self._row(item, label)
        if isinstance(result, InvalidInput):
            model_common.forget_frames(result)
        return result

    def _row(self, item, label):
        try:
            return self.pixels(item, label)
        except InvalidInput as error:
            return error
        except BOMB as error:
            found = re.search(r"\((\d+) pixels\)", str(error))
            return InvalidInput(label, f"is {found.group(1) if found else 'too many'} pixels, over the limit of "
                                       f"{self.max_pixels} (parameter max_image_pixels)")
        except MemoryError:
            return InvalidInput(label, "is too large to decode in the memory available")
        except Exception as error:
            return InvalidInput(label, f"could not be decoded ({type(error).__name__}: {error})")

    @model_common.tracing.per_request  # a request traced by parameter: its own span (off: execute itself)
    def execute(self, requests):
        rows, per_request = [], [[] for _ in requests]  # rows: (request index, row, item)
        for i, request in enumerate(requests):
            try:
                # rank 2 ([rows, 1], config max_batch_size > 0): a shape whose rows wrap past 2^32 arrives without
                # its batch dimension, and is refused here instead of served as one image (read_bytes)
                items = model_common.read_bytes(request, "image", rank=2)
            except InvalidInput as error:
                model_common.forget_frames(error)  # (see row())
                per_request[i].append(error)
                continue
            rows.extend((i, r, item) for r, item in enumerate(items))
        work = [(item, f"image[{r}]") for _, r, item in rows]
        if self.pool is not None and len(work) > 1:  # Pillow releases the GIL while it decodes and resizes
            results = list(self.pool.map(lambda job: self.row(*job), work))
        else:
            results = [self.row(*job) for job in work]
        for (i, _, _), result in zip(rows, results):
            per_request[i].append(result)
        responses = []
        for results in per_request:
            error = next((r for r in results if isinstance(r, InvalidInput)),
                         None if results else InvalidInput("image", "is empty: the request has no image"))
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error.triton_error))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(PIXEL_VALUES, np.stack(results))]))
        return responses

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown(wait=False)
