"""The CLIP family: open_clip models (architecture + pretrained tag or checkpoint file) and Hugging Face CLIP
folders, as a text tower behind the tokenizer model and an image tower behind the image preprocessing model."""
import glob
import importlib.util
import json
import os
import sys
import tempfile
import time
import types

from .. import fail, image_config, weights
from ..graph import OPSET, finalize_onnx
from ..install import install_export
from ..progress import staged
from ..repository import (
    build_batch_strategy,
    clip_image_names,
    model_names,
    token_guard,
    warmup_lengths,
    write_clip_image_configs,
    write_configs,
    write_tokenizer,
    write_warmup,
)
from ..vectors import calibrate, write_vectors

CLIP_SITE = "clip-site"  # in the venv (sys.prefix): requirements-clip.txt's packages
CONTEXT_LENGTH = 77  # CLIP's text length: open_clip's positional embeddings and tokenizer

_TORCHVISION_SCHEMAS = []  # the Library that defines them must stay alive, or the schemas go with it


def import_open_clip():
    """open_clip, from .venv/clip-site (requirements-clip.txt: a folder kept off the venv's path, because once
    torchvision is importable transformers imports it for most models and fails). PyPI's torchvision is a CUDA
    build: its compiled ops (_C.so) do not load without libtorch_cuda.so. open_clip uses only its Python transforms,
    which do not need them; but importing torchvision registers fake kernels for nms and qnms, which needs those
    ops' schemas. So: load the compiled ops when they load, else define the two schemas, then import."""
    import torch

    site = os.path.join(sys.prefix, CLIP_SITE)
    if os.path.isdir(site) and site not in sys.path:
        sys.path.insert(0, site)
    if "torchvision" not in sys.modules and not _TORCHVISION_SCHEMAS:
        spec = importlib.util.find_spec("torchvision")
        if spec is None:
            fail(f"open_clip is not installed: run `make setup` (it installs requirements-clip.txt into {site})")
        libraries = glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so"))
        try:
            torch.ops.load_library(libraries[0])
        except (IndexError, OSError):
            schemas = torch.library.Library("torchvision", "DEF")
            for op in ("nms", "qnms"):
                schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _TORCHVISION_SCHEMAS.append(schemas)
    import open_clip

    return open_clip


def load_open_clip(architecture, pretrained):
    """(model, preprocess, tokenizer) of an open_clip model: `pretrained` is a tag (downloaded from the hub), a
    checkpoint file, or None (random weights: tests and benchmarks only)."""
    open_clip = import_open_clip()
    if architecture not in open_clip.list_models():
        fail(f"--open-clip {architecture!r} is not an open_clip architecture (open_clip.list_models())")
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(architecture, pretrained=pretrained)
    except Exception as error:  # noqa: BLE001 - a download or checkpoint failure gets one line
        fail(f"open_clip cannot build {architecture} with pretrained={pretrained!r}: {type(error).__name__}: "
             f"{error}. Offline, pass a local checkpoint file as --pretrained")
    tokenizer = open_clip.get_tokenizer(architecture)
    if type(tokenizer).__name__ != "SimpleTokenizer" or tokenizer.context_length != CONTEXT_LENGTH or \
            getattr(tokenizer.clean_fn, "__name__", "") != "_clean_lower":
        fail(f"{architecture}'s tokenizer is {type(tokenizer).__name__} (context {tokenizer.context_length}): only "
             f"CLIP's own BPE tokenizer with 77 tokens and lower-case cleaning is exported")
    return model.eval(), preprocess, tokenizer


def fast_tokenizer_of(simple):
    """open_clip's SimpleTokenizer as a Hugging Face fast tokenizer with the same ids: the same vocabulary and
    merges, CLIP's pre-tokenizing pattern, start/end tokens, truncation to 77 with the end token kept. open_clip
    also cleans each text first (ftfy, HTML unescaping, whitespace, lower case): the tokenizer model does that
    when text_cleaning.json says "open_clip" (write_text_cleaning)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    start, end = simple.decoder[simple.sot_token_id], simple.decoder[simple.eot_token_id]
    merges = [pair for pair, _ in sorted(simple.bpe_ranks.items(), key=lambda item: item[1])]
    fast = Tokenizer(models.BPE(vocab=simple.encoder, merges=merges, continuing_subword_prefix="",
                                end_of_word_suffix="</w>", fuse_unk=False))
    fast.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                            normalizers.Lowercase()])
    fast.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(simple.pat.pattern), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens([start, end])
    fast.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}", pair=f"{start} $A {end} $B {end}",
        special_tokens=[(start, simple.sot_token_id), (end, simple.eot_token_id)])
    return PreTrainedTokenizerFast(tokenizer_object=fast, bos_token=start, eos_token=end, pad_token=end,
                                   unk_token=end, model_max_length=CONTEXT_LENGTH)


def write_text_cleaning(tokenizer_dir, cleaning):
    """text_cleaning.json beside tokenizer.json: the cleaning the tokenizer model applies before tokenizing."""
    os.makedirs(tokenizer_dir, exist_ok=True)
    with open(os.path.join(tokenizer_dir, "text_cleaning.json"), "w", encoding="utf-8") as handle:
        json.dump({"clean": cleaning}, handle)


def build_towers(model, source):
    """(text tower, image tower): torch modules whose ONNX graphs return the L2-normalized embedding.

    open_clip's text transformer is causal with positional embeddings for exactly 77 positions and pools at the end
    token (or as its config says): the graph takes the tokenizer's rows padded to their group's width, puts
    open_clip's pad id (0) in the padding, pads to 77 and calls encode_text itself, so every open_clip pooling and
    text variant computes what open_clip computes. Hugging Face's CLIP takes any width with its attention mask."""
    import torch

    normalize = torch.nn.functional.normalize

    class Tower(torch.nn.Module):
        """The model (its weights are the graph's) and the function that computes one tower's output."""

        def __init__(self, compute):
            super().__init__()
            self.model, self.compute = model, compute

        def forward(self, *inputs):
            return self.compute(*inputs)

    def open_clip_text(input_ids, attention_mask):
        # the tokenizer pads widths to a multiple of 8 (80 > 77): past 77 there is only padding
        ids = (input_ids * attention_mask)[:, :CONTEXT_LENGTH]
        ids = torch.nn.functional.pad(ids, (0, CONTEXT_LENGTH - ids.shape[1]))
        # int32: open_clip pools at the ids' argmax, and onnxruntime has no ArgMax kernel for int64
        return model.encode_text(ids.to(torch.int32), normalize=True)

    def hf_text(input_ids, attention_mask):
        features = model.get_text_features(input_ids=input_ids[:, :CONTEXT_LENGTH],
                                           attention_mask=attention_mask[:, :CONTEXT_LENGTH])
        return normalize(features.pooler_output, p=2.0, dim=-1)

    def hf_image(pixel_values):
        return normalize(model.get_image_features(pixel_values=pixel_values).pooler_output, p=2.0, dim=-1)

    if source == "open_clip":
        return Tower(open_clip_text).eval(), Tower(lambda pixels: model.encode_image(pixels, normalize=True)).eval()
    return Tower(hf_text).eval(), Tower(hf_image).eval()


@staged("trace")
def export_towers(text_tower, image_tower, tokenizer, image_size, workdir):
    """Both towers to ONNX (opset 17, dynamic batch; the text tower also a dynamic width). Returns the two paths."""
    import torch

    sample = tokenizer(["export sample", "a second, longer export sample"], padding=True, return_tensors="pt")
    pixels = torch.randn(2, 3, *image_size)
    text_path, image_path = os.path.join(workdir, "text.onnx"), os.path.join(workdir, "image.onnx")
    # nn.MultiheadAttention's inference fast path is one fused op that ONNX has no export for: trace the plain one.
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad():
        torch.onnx.export(text_tower, (sample["input_ids"], sample["attention_mask"]), text_path,
                          input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                        "attention_mask": {0: "batch", 1: "sequence"}, "embedding": {0: "batch"}},
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
        torch.onnx.export(image_tower, (pixels,), image_path, input_names=["pixel_values"],
                          output_names=["embedding"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "embedding": {0: "batch"}},
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    return text_path, image_path


@staged("parity")
def parity_check(reference, tokenizer, text_path, image_path, image_size, min_cosine):
    """The exported graphs in onnxruntime against the library's own functions: open_clip's tokenize + encode_text
    / encode_image, or transformers' get_text_features / get_image_features; and our tokenizer's ids against the
    library's. Returns the figures; stops the export below `min_cosine`."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from ..parity import PARITY_TEXTS

    texts = [*PARITY_TEXTS, "a photo of a cat", "a diagram of a transformer"]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=CONTEXT_LENGTH, return_tensors="np")
    pixels = np.random.default_rng(0).standard_normal((3, 3, *image_size)).astype(np.float32)
    with torch.no_grad():
        if reference.source == "open_clip":
            ids = reference.tokenize(texts)
            expected_text = reference.model.encode_text(ids, normalize=True).numpy()
            expected_image = reference.model.encode_image(torch.from_numpy(pixels), normalize=True).numpy()
            theirs = [row[:list(row).index(reference.end_id) + 1] for row in ids.tolist()]
        else:
            theirs = reference.tokenizer(texts, truncation=True, max_length=CONTEXT_LENGTH)["input_ids"]
            encoded = reference.tokenizer(texts, padding=True, truncation=True, max_length=CONTEXT_LENGTH,
                                          return_tensors="pt")
            expected_text = torch.nn.functional.normalize(reference.model.get_text_features(
                **encoded).pooler_output, dim=-1).numpy()
            expected_image = torch.nn.functional.normalize(reference.model.get_image_features(
                pixel_values=torch.from_numpy(pixels)).pooler_output, dim=-1).numpy()
    ours = [list(row[mask.astype(bool)]) for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    if ours != theirs:
        wrong = [text for text, a, b in zip(texts, ours, theirs) if a != b]
        fail(f"parity check failed: the exported tokenizer's ids differ from {reference.source}'s for {wrong[:2]}")
    text_session = ort.InferenceSession(text_path, providers=["CPUExecutionProvider"])
    image_session = ort.InferenceSession(image_path, providers=["CPUExecutionProvider"])
    actual_text = text_session.run(["embedding"], {"input_ids": batch["input_ids"].astype(np.int64),
                                                   "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
    actual_image = image_session.run(["embedding"], {"pixel_values": pixels})[0]
    figures = {}
    for kind, actual, expected in (("text", actual_text, expected_text), ("image", actual_image, expected_image)):
        figures[kind] = {"min_cosine": float((actual * expected).sum(-1).min()),
                         "max_abs_diff": float(np.abs(actual - expected).max())}
    print(f"export: parity vs {reference.source} ({len(texts)} texts, one truncated; 3 images): "
          f"{json.dumps(figures)}; token ids equal")
    worst = min(f["min_cosine"] for f in figures.values())
    if worst < min_cosine:
        fail(f"parity check failed: min cosine {worst:.7f} < {min_cosine}")
    return figures


def export(args, repository, started, folder=None):
    """A CLIP model (open_clip, or a Hugging Face CLIP folder): the text side as a text export (ensemble NAME,
    NAME_tokenizer, the text tower NAME_embedding, NAME_bls) and the image side (ensemble NAME_image, the
    preprocessing model NAME_image_preprocess, the image tower NAME_image_embedding). No rerank, no late chunking."""
    import torch

    if args.name is None:
        fail("a CLIP export needs --name (its models are NAME, NAME_image, ...)")
    if args.outputs or args.pooling or args.max_length or args.matryoshka_dims or args.fp16:
        fail("--outputs, --pooling, --max-length, --matryoshka-dims and --fp16 do not apply to CLIP exports")
    if args.open_clip:
        if not args.pretrained:
            fail("--open-clip needs --pretrained: a tag (e.g. laion2b_s34b_b79k), a checkpoint file, or none "
                 "(random weights, for tests)")
        pretrained = None if args.pretrained.lower() == "none" else args.pretrained
        model, preprocess, simple = load_open_clip(args.open_clip, pretrained)
        tokenizer = fast_tokenizer_of(simple)
        reference = types.SimpleNamespace(source="open_clip", model=model, tokenize=simple,
                                          end_id=simple.eot_token_id)
        pixels = image_config.from_open_clip(model, preprocess)
        args.model, architecture, cleaning = f"open_clip:{args.open_clip}", args.open_clip, "open_clip"
        if pretrained is None:
            print("export: warning: --pretrained none: random weights (for tests and benchmarks, not for search)")
    else:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

        if args.pretrained:
            fail("--pretrained goes with --open-clip; a Hugging Face folder carries its weights")
        model = CLIPModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        reference = types.SimpleNamespace(source="transformers", model=model, tokenizer=tokenizer)
        pixels = image_config.from_hf_processor(CLIPImageProcessor.from_pretrained(folder))
        architecture, pretrained, cleaning = "clip", None, None
    text_tower, image_tower = build_towers(model, reference.source)
    image_size = (pixels["height"], pixels["width"])
    # no weight either tower reads is random (a Hugging Face folder whose weights CLIPModel does not name)
    weights.check((text_tower, weights.sample(tokenizer)), (image_tower, lambda: (torch.zeros(1, 3, *image_size),)))
    with torch.no_grad():
        dim = int(image_tower(torch.zeros(1, 3, *image_size)).shape[-1])
    names = model_names(args.name)[:4] + (None,)  # no rerank model
    image_names = clip_image_names(args.name)
    print(f"export: {args.model} (CLIP from {reference.source}, pretrained {pretrained}, {dim}-d, image "
          f"{image_size[0]}x{image_size[1]}, text {CONTEXT_LENGTH} tokens) → {repository} as {args.name}, "
          f"{image_names[0]}")
    calibration = calibrate(lambda ids, mask: (text_tower(ids, mask),), tokenizer, CONTEXT_LENGTH, [dim], "",
                            args.calibration_corpus)
    warmup = warmup_lengths(CONTEXT_LENGTH)
    with tempfile.TemporaryDirectory() as workdir:
        staging = os.path.join(workdir, "repository")
        text_path, image_path = export_towers(text_tower, image_tower, tokenizer, image_size, workdir)
        token_budget = build_batch_strategy(os.path.join(staging, names[2]))
        text_onnx = finalize_onnx(text_path, os.path.join(staging, names[2], "1"), False, args.external_data,
                                  {"embedding": [dim]}, token_guard(token_budget, names, CONTEXT_LENGTH))
        image_onnx = finalize_onnx(image_path, os.path.join(staging, image_names[2], "1"), False,
                                   args.external_data, {"embedding": [dim]})
        figures = parity_check(reference, tokenizer, text_onnx, image_onnx, image_size, 0.9999)
        write_tokenizer(tokenizer, CONTEXT_LENGTH, os.path.join(staging, names[1], "1"))
        if cleaning:
            write_text_cleaning(os.path.join(staging, names[1], "1"), cleaning)
        write_vectors(os.path.join(staging, names[3], "1"), [dim], calibration)
        # the text tower's graph (py) returns `embedding` only: no embedding_unnormalized, no token_embeddings
        write_configs(staging, names, ["dense"], {"D": dim}, warmup, CONTEXT_LENGTH, encoder_only=(),
                      with_dense=())
        write_warmup(staging, names[2], tokenizer, warmup)
        write_clip_image_configs(staging, args.name, *image_size, dim)
        image_config.write_preprocess(os.path.join(staging, image_names[1], "1"), pixels)
        manifest = {
            "id": args.name, "kind": "clip", "name": names[0], "tokenizer_model": names[1],
            "encoder_model": names[2], "bls_model": names[3], "rerank_model": None, "chunks_model": None,
            "image_model": image_names[0], "image_preprocess_model": image_names[1],
            "image_encoder_model": image_names[2], "model": args.model, "source": reference.source,
            "architecture": architecture, "pretrained": pretrained, "outputs": ["dense"], "embedding_size": dim,
            "colbert_size": None, "max_length": CONTEXT_LENGTH, "image_size": list(image_size),
            "text_cleaning": cleaning, "dimensions": [dim], "prompts": {}, "default_prompt_name": None,
            "calibration": {k: v for k, v in calibration.items() if k != "ranges"}, "fp16": False,
            "token_budget_batching": token_budget, "opset": OPSET, "parity": figures,
            "onnx": [os.path.relpath(p, staging) for p in (text_onnx, image_onnx)],
            "served_names": args.served_names, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        install_export(staging, repository, (*names[:4], *image_names), manifest, started)
    return 0
