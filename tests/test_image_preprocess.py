"""The image preprocessing model (model_source/tokenizer/image_preprocess.py) through its real initialize and
execute with a fake triton_python_backend_utils: pixels equal (1e-5) to open_clip's preprocess and transformers'
CLIPImageProcessor (PIL backend) on images of every kind, its preprocess.json written by
exporter/image_config.py; hostile rows refused with their cause while the other requests get their pixels."""
import io
import json
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from conftest import import_python_model
from exporter import image_config
from exporter.families.clip import import_open_clip
from local_triton.settings import MODEL_SOURCE

TOLERANCE = 1e-5


# ---------------------------------------------------------------- the fake triton_python_backend_utils
class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = "INVALID_ARG", "UNAVAILABLE", "INTERNAL", "CANCELLED"

    def __init__(self, message, code=None):
        self._message, self.code = message, code

    def message(self):
        return self._message


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors, self.error = output_tensors or [], error


class Request:
    def __init__(self, *images):
        self.image = np.array(list(images) + [None], dtype=np.object_)[:-1].reshape(-1, 1)


def get_input_tensor_by_name(request, name):
    return Tensor(name, request.image) if name == "image" else None


@pytest.fixture(scope="module")
def module():
    return import_python_model("image_preprocess", path="model_source/tokenizer/image_preprocess.py",
                               TritonError=TritonError, TritonModelException=TritonModelException, Tensor=Tensor,
                               InferenceResponse=InferenceResponse, get_input_tensor_by_name=get_input_tensor_by_name)


def make_model(module, directory, preprocess, **parameters):
    """The model initialized on a repository folder holding preprocess.json (written by the export helper)."""
    image_config.write_preprocess(os.path.join(directory, "1"), preprocess)
    values = {"max_image_bytes": "20971520", "max_image_pixels": "40000000", "decode_threads": "2", **parameters}
    config = {"parameters": {k: {"string_value": str(v)} for k, v in values.items()},
              "output": [{"name": "pixel_values", "dims": ["3", str(preprocess["height"]), str(preprocess["width"])]}]}
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(directory), "model_version": "1"})
    return model


def run(model, *requests):
    """Per request: its pixel_values, or its error (TritonError)."""
    responses = model.execute(list(requests))
    assert len(responses) == len(requests)
    return [r.error if r.error is not None else r.output_tensors[0].as_numpy() for r in responses]


# ---------------------------------------------------------------- images, generated and encoded in memory
def _picture(width, height, seed):
    """Smooth gradients, edges and noise: resampling differences show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 64, size=(height, width, 3))
    return np.clip(base + noise - 32, 0, 255).astype(np.uint8)


def _encode(image, format, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def _rgba():
    pixels = np.dstack([_picture(300, 200, 2), np.tile(np.linspace(0, 255, 300).astype(np.uint8), (200, 1))])
    pixels[:, :40, 3] = 0  # fully transparent, with colour underneath: dropped or composited differently
    return Image.fromarray(pixels, "RGBA")


def _palette():
    image = Image.fromarray(_picture(257, 199, 3)).quantize(64)
    image.info["transparency"] = 5
    return image


def _gif():
    frames = [Image.fromarray(_picture(240, 180, seed)).quantize(128) for seed in (4, 5, 6)]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def _exif_rotated():
    image = Image.fromarray(_picture(320, 240, 7))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to view
    return _encode(image, "JPEG", quality=90, exif=exif)


IMAGES = {
    "rgb_jpeg": lambda: _encode(Image.fromarray(_picture(640, 480, 1)), "JPEG", quality=90),
    "rgba_png": lambda: _encode(_rgba(), "PNG"),
    "palette_png": lambda: _encode(_palette(), "PNG"),
    "la_png": lambda: _encode(_rgba().convert("LA"), "PNG"),
    "grayscale_jpeg": lambda: _encode(Image.fromarray(_picture(333, 500, 8)).convert("L"), "JPEG"),
    "webp": lambda: _encode(Image.fromarray(_picture(400, 300, 9)), "WEBP", quality=80),
    "animated_gif": _gif,
    "exif_rotated_jpeg": _exif_rotated,
    "tiny": lambda: _encode(Image.fromarray(_picture(5, 3, 10)), "PNG"),
    "odd_227x224": lambda: _encode(Image.fromarray(_picture(227, 224, 11)), "PNG"),  # no resize; crop 1.5 vs 1
    "odd_454x448": lambda: _encode(Image.fromarray(_picture(454, 448, 12)), "PNG"),  # resized to 227x224
    "odd_225x230": lambda: _encode(Image.fromarray(_picture(225, 230, 13)), "PNG"),
    "odd_299x231": lambda: _encode(Image.fromarray(_picture(299, 231, 14)), "PNG"),
    "panorama": lambda: _encode(Image.fromarray(_picture(4000, 250, 15)), "JPEG", quality=85),
}


@pytest.fixture(scope="module")
def images():
    return {name: make() for name, make in IMAGES.items()}


def _reference(transform, data):
    """The library's preprocess of the decoded image, EXIF orientation applied first (as the model does)."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    return np.asarray(transform(image), dtype=np.float32)


# ---------------------------------------------------------------- the transforms under test
@pytest.fixture(scope="module")
def open_clip():
    return import_open_clip()


def _open_clip_variant(open_clip, name, **options):
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, **options)
    return image_config.from_open_clip(model, preprocess), preprocess


def _hf_variant(**options):
    import_open_clip()  # transformers imports torchvision: it needs the same set-up
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil(**options)
    return image_config.from_hf_processor(processor), lambda image: processor(image, return_tensors="np")[
        "pixel_values"][0]


def _torchvision_padding(open_clip):
    """A crop larger than the resize: torchvision pads (in the image's mode) before cropping. open_clip's own
    transforms never do (their resize covers the crop)."""
    from open_clip.transform import MaybeConvertMode, MaybeToTensor
    from torchvision import transforms

    model, _, _ = open_clip.create_model_and_transforms("RN50", pretrained=None)
    preprocess = transforms.Compose([transforms.Resize(200, interpolation=transforms.InterpolationMode.BICUBIC),
                                     transforms.CenterCrop((227, 240)), MaybeConvertMode(), MaybeToTensor(),
                                     transforms.Normalize(open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)])
    return image_config.from_open_clip(model, preprocess), preprocess


VARIANTS = {
    "open_clip ViT-B-32": lambda oc: _open_clip_variant(oc, "ViT-B-32"),
    # another size, mean, std and interpolation
    "open_clip RN50 288 bilinear": lambda oc: _open_clip_variant(
        oc, "RN50", force_image_size=288, image_interpolation="bilinear", image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5)),
    "open_clip RN50 squash": lambda oc: _open_clip_variant(oc, "RN50", force_image_size=256,
                                                           image_resize_mode="squash"),
    "transformers CLIP": lambda oc: _hf_variant(),
    "transformers squash bilinear": lambda oc: _hf_variant(size={"height": 240, "width": 200}, resample=2,
                                                           do_center_crop=False, image_mean=[0.5, 0.4, 0.3]),
    # crops larger than the resize: padded, torchvision with floor(d / 2) before, transformers ceil(d / 2)
    "torchvision crop padded": _torchvision_padding,
    "transformers crop padded": lambda oc: _hf_variant(size={"shortest_edge": 200}, crop_size={"height": 227,
                                                                                               "width": 240}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pixels_equal_the_librarys(module, open_clip, images, variant, tmp_path):
    preprocess, transform = VARIANTS[variant](open_clip)
    model = make_model(module, tmp_path, preprocess)
    names = list(images)
    # one execute: one request per image, and one request holding two of them
    results = run(model, *[Request(images[n]) for n in names], Request(images["rgba_png"], images["tiny"]))
    for name, pixels in zip(names, results):
        assert not isinstance(pixels, TritonError), f"{name}: {pixels.message()}"
        expected = _reference(transform, images[name])
        assert pixels.shape == (1, 3, preprocess["height"], preprocess["width"]) and pixels.dtype == np.float32
        assert np.abs(pixels[0] - expected).max() <= TOLERANCE, f"{variant}, {name}"
    assert np.array_equal(results[-1], np.stack([results[names.index("rgba_png")][0],
                                                 results[names.index("tiny")][0]]))


def test_export_helper_configs(open_clip):
    config, _ = VARIANTS["open_clip ViT-B-32"](open_clip)
    assert config == {"source": "open_clip", "resize": "shortest", "resize_size": 224, "interpolation": "bicubic",
                      "crop": "center", "crop_rounding": "round", "convert_rgb_first": False, "alpha": "drop",
                      "rescale": 1 / 255, "mean": [0.48145466, 0.4578275, 0.40821073],
                      "std": [0.26862954, 0.26130258, 0.27577711], "height": 224, "width": 224}
    config, _ = _hf_variant()
    assert (config["crop_rounding"], config["convert_rgb_first"], config["alpha"]) == ("floor", True, "white")
    assert (config["resize"], config["resize_size"], config["height"], config["width"]) == ("shortest", 224, 224, 224)
    # open_clip's non-square shortest resize (ResizeKeepRatio, always bicubic)
    model, _, _ = open_clip.create_model_and_transforms("RN50", pretrained=None)
    keep_ratio = open_clip.image_transform((224, 288), is_train=False)
    config = image_config.from_open_clip(model, keep_ratio)
    assert (config["resize"], config["resize_size"], config["height"], config["width"]) == ("shortest", [224, 288],
                                                                                            224, 288)
    # what cannot be reproduced is refused
    with pytest.raises(SystemExit, match="longest=1.000.*not supported"):
        image_config.from_open_clip(model, open_clip.image_transform(224, is_train=False, resize_mode="longest"))
    with pytest.raises(SystemExit, match="size"):
        _hf_variant(size={"longest_edge": 300})


def test_keep_ratio_resize_matches_open_clip(module, open_clip, images, tmp_path):
    model, _, _ = open_clip.create_model_and_transforms("RN50", pretrained=None)
    transform = open_clip.image_transform((224, 288), is_train=False)
    served = make_model(module, tmp_path, image_config.from_open_clip(model, transform))
    for name in ("rgb_jpeg", "odd_299x231", "panorama", "tiny", "rgba_png"):
        (pixels,) = run(served, Request(images[name]))
        assert np.abs(pixels[0] - _reference(transform, images[name])).max() <= TOLERANCE, name


def test_crop_offsets_round_half_to_even_or_floor(module):
    base = {"height": 224, "width": 224, "resize": "shortest", "resize_size": 224, "crop": "center"}
    torchvision = module.Transform({**base, "crop_rounding": "round"})
    transformers = module.Transform({**base, "crop_rounding": "floor"})
    # d = 3: round(1.5) = 2, 3 // 2 = 1; d = 1: round(0.5) = 0 = 1 // 2; padding: floor / ceil of d / 2 before
    assert [torchvision.offset(n, 224) for n in (227, 225, 221)] == [2, 0, -1]
    assert [transformers.offset(n, 224) for n in (227, 225, 221)] == [1, 0, -2]


# ---------------------------------------------------------------- hostile rows
def _png_header_only(width, height):
    """A tiny PNG whose header declares width x height pixels."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


def _clip_config():
    """CLIP's preprocessing with mean = std = 0.5, from an object with an image processor's settings."""
    return image_config.from_hf_processor(type("Processor", (), {
        "do_resize": True, "size": {"shortest_edge": 224}, "resample": 3, "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_convert_rgb": True}))


@pytest.mark.parametrize("threads", [2, 1])
def test_hostile_rows_fail_their_request_only(module, images, threads, tmp_path):
    jpeg, png = images["rgb_jpeg"], images["rgba_png"]
    hostile = {
        "not an image Pillow can read": b"GIF89a? no, just text pretending to be an image",
        "truncated or corrupt": jpeg[:len(jpeg) // 2],
        "truncated or corrupt ": png[:len(png) // 2],
        "is empty": b"",
        "bytes, over the limit of 200000 (parameter max_image_bytes)": b"\xff" * 200001,
        "10000000000 pixels, over the limit of 40000000 (parameter max_image_pixels)": _png_header_only(100000,
                                                                                                         100000),
        "30000x2000 = 60000000 pixels, over the limit": _png_header_only(30000, 2000),  # below Pillow's 2x error
        "aspect ratio": _encode(Image.new("L", (100000, 1)), "PNG"),
        "malformed: its length prefix says 1000 bytes but 3 follow": module.model_common.deserialize_bytes_tensor(
            np.frombuffer(b"\xe8\x03\x00\x00abc", dtype=np.uint8))[0],
    }
    assert len(_png_header_only(100000, 100000)) < 100
    good = _reference(_hf_variant(image_mean=[0.5] * 3, image_std=[0.5] * 3)[1], jpeg)
    model = make_model(module, tmp_path, _clip_config(), max_image_bytes=200000, decode_threads=threads)
    results = run(model, Request(jpeg), *[Request(item) for item in hostile.values()], Request(jpeg, b"xx"),
                  Request(jpeg))
    for cause, result in zip(hostile, results[1:]):
        assert isinstance(result, TritonError) and result.code == TritonError.INVALID_ARG, cause
        assert result.message().startswith("image[0] ") and cause.strip() in result.message(), result.message()
    assert "image[1] is not an image" in results[-2].message()
    for pixels in (results[0], results[-1]):
        assert np.abs(pixels[0] - good).max() <= TOLERANCE
    (again,) = run(model, Request(jpeg))  # still working afterwards
    assert np.array_equal(again, results[0])


def test_config_template_declares_what_the_model_reads():
    with open(os.path.join(MODEL_SOURCE, "tokenizer", "image.pbtxt.template"), encoding="utf-8") as f:
        template = f.read()
    for key in ("max_image_bytes", "max_image_pixels", "decode_threads"):
        assert f'key: "{key}"' in template
    assert "dims: [ 3, ${height}, ${width} ]" in template and "rate_limiter" not in template
