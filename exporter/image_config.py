"""preprocess.json: the image preprocessing model's transform (model_source/tokenizer/image_preprocess.py), from
open_clip's preprocess (torchvision transforms on a PIL image) or transformers' CLIPImageProcessor. Anything the
model cannot reproduce exactly is refused.

    source             "open_clip" | "transformers" (what it was read from)
    height, width      pixel_values' size (the crop, or the squash size)
    resize             "shortest" | "squash" | null
    resize_size        shortest: an int (shorter side to it, longer int(size * long / short): torchvision's
                       Resize(int), transformers' shortest_edge) or [h, w] (open_clip's ResizeKeepRatio: both sides
                       divided by min(H / h, W / w), Python round()); squash: [h, w]
    interpolation      PIL resampling name: "bicubic", "bilinear", "nearest", "box", "hamming", "lanczos"
    crop               "center" | null
    crop_rounding      "round" (torchvision: int(round(d / 2)), half to even) | "floor" (transformers: d // 2)
    convert_rgb_first  true: to RGB before the resize (transformers); false: after the crop (open_clip)
    alpha              "white": transparency composited onto white (transformers' convert_to_rgb) | "drop"
    rescale            pixel values times this (1/255; 1.0 without rescaling)
    mean, std          per channel, in RGB order ([0, 0, 0] / [1, 1, 1] without normalization)
"""
import json
import os

from . import fail


def _size(size):
    """(h, w) of an int or a 1- or 2-sequence."""
    if isinstance(size, int):
        return size, size
    size = [int(s) for s in size]
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _pil_name(resample):
    """PIL's name ("bicubic") of a PIL resampling filter: an int or Image.Resampling."""
    from PIL import Image

    try:
        return Image.Resampling(int(resample)).name.lower()
    except (TypeError, ValueError):
        fail(f"image resampling {resample!r}: not a PIL resampling filter")


def from_open_clip(model, preprocess=None):
    """preprocess.json's dict from an open_clip model's inference preprocess (the transform returned by
    create_model_and_transforms; None: built from the model's preprocess_cfg). The transform's steps decide, its
    config is cross-checked."""
    from .families.clip import import_open_clip

    open_clip = import_open_clip()
    from open_clip.transform import MaybeConvertMode, MaybeToTensor, ResizeKeepRatio, _convert_to_rgb
    from torchvision import transforms
    from torchvision.transforms.functional import pil_modes_mapping

    cfg = open_clip.get_model_preprocess_cfg(model)
    if preprocess is None:
        preprocess = open_clip.image_transform_v2(open_clip.PreprocessCfg(**cfg), is_train=False)
    steps = list(getattr(preprocess, "transforms", [preprocess]))
    config = {"source": "open_clip", "resize": None, "resize_size": None, "interpolation": "bicubic", "crop": None,
              "crop_rounding": "round", "convert_rgb_first": False, "alpha": "drop", "rescale": None,
              "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}
    converted = tensor = False
    for step in steps:
        name = type(step).__name__
        if tensor and not isinstance(step, transforms.Normalize):
            fail(f"open_clip preprocess: {name} after ToTensor is not supported")
        if isinstance(step, transforms.Resize):
            if config["resize"] or config["crop"] or step.max_size is not None:
                fail(f"open_clip preprocess: {step!r} is not supported (a second resize, after a crop, or max_size)")
            size = step.size
            if isinstance(size, int) or len(size) == 1:
                config["resize"], config["resize_size"] = "shortest", size if isinstance(size, int) else int(size[0])
            else:
                config["resize"], config["resize_size"] = "squash", list(_size(size))
            config["interpolation"] = _pil_name(pil_modes_mapping[step.interpolation])
        elif isinstance(step, ResizeKeepRatio):
            random = step.random_scale_prob or step.random_aspect_prob
            if config["resize"] or config["crop"] or step.longest != 0.0 or random:
                fail(f"open_clip preprocess: {step!r} is not supported (only the shortest side, not random)")
            config["resize"], config["resize_size"] = "shortest", list(step.size)
            config["interpolation"] = _pil_name(pil_modes_mapping[step.interpolation])
        elif isinstance(step, transforms.CenterCrop):
            if config["crop"]:
                fail("open_clip preprocess: two crops")
            config["crop"] = "center"
            config["height"], config["width"] = _size(step.size)
        elif isinstance(step, MaybeConvertMode) or step is _convert_to_rgb:
            if getattr(step, "mode", "RGB") != "RGB":
                fail(f"open_clip preprocess: conversion to {step.mode}, not RGB")
            config["convert_rgb_first"] = not config["resize"] and not config["crop"]
            converted = True
        elif isinstance(step, (MaybeToTensor, transforms.ToTensor)):
            config["rescale"], tensor = 1 / 255, True
        elif isinstance(step, transforms.Normalize):
            if not tensor:
                fail("open_clip preprocess: Normalize before ToTensor")
            config["mean"], config["std"] = [float(m) for m in step.mean], [float(s) for s in step.std]
        else:
            fail(f"open_clip preprocess: the step {step!r} cannot be reproduced by the image preprocessing model "
                 f"(supported: Resize, ResizeKeepRatio on the shortest side, CenterCrop, RGB conversion, ToTensor, "
                 f"Normalize; resize_mode 'longest' pads and is not)")
    if not converted or not tensor:
        fail("open_clip preprocess: no RGB conversion or no ToTensor step")
    if config["crop"] is None:
        if config["resize"] != "squash":
            fail("open_clip preprocess: no crop and no squash resize: the output size would vary")
        config["height"], config["width"] = config["resize_size"]
    for key in ("mean", "std"):
        if key in cfg and [round(float(v), 6) for v in cfg[key]] != [round(v, 6) for v in config[key]]:
            fail(f"open_clip preprocess: Normalize's {key} {config[key]} differs from the model's preprocess_cfg "
                 f"{list(cfg[key])}")
    if len(config["mean"]) != 3 or len(config["std"]) != 3:
        fail(f"open_clip preprocess: mean/std {config['mean']} / {config['std']} are not 3 channels")
    return config


def _field(size, key):
    """A transformers size dict's (or SizeDict's) entry."""
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def from_hf_processor(processor):
    """preprocess.json's dict from a transformers CLIPImageProcessor (or one with its settings). The model
    reproduces the PIL backend (CLIPImageProcessorPil: Pillow resizes); the torchvision backend's settings mean the
    same steps, which it computes with torch's resize, within a pixel level of Pillow's."""
    config = {"source": "transformers", "resize": None, "resize_size": None, "interpolation": "bicubic",
              "crop": None, "crop_rounding": "floor", "convert_rgb_first": True, "alpha": "white", "rescale": None,
              "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}
    if getattr(processor, "do_pad", None):
        fail("image processor: do_pad is not supported")
    size = processor.size
    if processor.do_resize:
        others = [k for k in ("longest_edge", "max_height", "max_width", "min_pixels", "max_pixels")
                  if _field(size, k)]
        if _field(size, "shortest_edge") and not others:
            config["resize"], config["resize_size"] = "shortest", int(_field(size, "shortest_edge"))
        elif _field(size, "height") and _field(size, "width") and not others:
            config["resize"] = "squash"
            config["resize_size"] = [int(_field(size, "height")), int(_field(size, "width"))]
        else:
            fail(f"image processor: size {size} is not supported (shortest_edge alone, or height and width)")
        config["interpolation"] = _pil_name(processor.resample if processor.resample is not None else 2)
    if processor.do_center_crop:
        crop = processor.crop_size
        config["crop"] = "center"
        config["height"], config["width"] = int(_field(crop, "height")), int(_field(crop, "width"))
    elif config["resize"] == "squash":
        config["height"], config["width"] = config["resize_size"]
    else:
        fail("image processor: neither a center crop nor a resize to height and width: the output size would vary")
    # do_convert_rgb false: transformers keeps the image's channels (1 for grayscale, 4 for RGBA), which the image
    # tower cannot take; RGB images are the same either way, so the conversion is always made.
    if processor.do_rescale:
        config["rescale"] = float(processor.rescale_factor)
    if processor.do_normalize:
        mean, std = processor.image_mean, processor.image_std
        mean = [float(mean)] * 3 if isinstance(mean, (int, float)) else [float(m) for m in mean]
        std = [float(std)] * 3 if isinstance(std, (int, float)) else [float(s) for s in std]
        if len(mean) != 3 or len(std) != 3:
            fail(f"image processor: image_mean/image_std {mean} / {std} are not 3 channels")
        config["mean"], config["std"] = mean, std
    return config


def write_preprocess(version_dir, config):
    """preprocess.json into the image preprocessing model's version folder (beside its model.py)."""
    os.makedirs(version_dir, exist_ok=True)
    with open(os.path.join(version_dir, "preprocess.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")
