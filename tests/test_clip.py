"""CLIP (issue 19): an open_clip ViT-S-32 and a Hugging Face CLIP folder exported beside each other and served once.
KServe clients send text to NAME and encoded image bytes to NAME_image and get open_clip's (transformers') own
vectors: token ids equal to open_clip.tokenize, text vectors to encode_text, image vectors to encode_image of
open_clip's preprocess (EXIF rotation applied first), cosine >= 0.9999, over HTTP and gRPC. Hostile images get a
400 naming the cause while the other requests of the moment succeed and the stub lives on.

Weights are random (no hub here): the open_clip model is built with a seed and saved as a checkpoint file, which the
export takes as --pretrained (open_clip's own checkpoint path), so the reference here has the same weights. ViT-S-32
is ViT-B-32 (the seed API's) at half the width: the same tower, text model, tokenizer and transform, exported, loaded
and run in a fraction of the time.
"""
import concurrent.futures
import io
import os
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image

from conftest import PROJECT, SHARED_ADMIN_KEY, proxy_settings, serve_exports
from exporter.families.clip import import_open_clip
from triton_clients import PROTOCOLS, client, url_for

ARCHITECTURE = "ViT-S-32"
MIN_COSINE = 0.9999
TEXTS = [
    "a photo of a cat",
    "A RED Square On A White Background",
    "“curly quotes” &amp; HTML entities &lt;b&gt;",  # open_clip's cleaning: ftfy and html.unescape
    "Ünïcödé, 日本語のテキスト, emoji 🚀",
    "  whitespace\t\truns\n\nand   tabs  ",
    "a diagram of a transformer " * 20,  # over 77 tokens: truncated, end token kept
]


def encode(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def sample_images():
    """{name: encoded bytes}: the formats and modes users send (generated: solid colours, shapes, noise)."""
    rng = np.random.default_rng(19)
    noise = Image.fromarray(rng.integers(0, 256, (300, 420, 3), dtype=np.uint8))
    red = Image.new("RGB", (256, 256), (220, 20, 20))
    shapes = Image.new("RGB", (640, 360), (255, 255, 255))
    shapes.paste((20, 20, 200), (100, 60, 300, 260))
    shapes.paste((20, 160, 20), (380, 120, 560, 300))
    rgba = Image.fromarray(rng.integers(0, 256, (200, 150, 4), dtype=np.uint8), "RGBA")
    rotated = encode(noise, "JPEG", quality=90, exif=exif_orientation(6))
    frames = [Image.new("P", (120, 90), i) for i in (3, 7)]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    return {"noise.jpg": encode(noise, "JPEG", quality=92), "red.png": encode(red, "PNG"),
            "shapes.webp": encode(shapes, "WEBP", quality=90), "rgba.png": encode(rgba, "PNG"),
            "gray.png": encode(noise.convert("L"), "PNG"), "rotated.jpg": rotated, "animated.gif": gif.getvalue()}


def exif_orientation(value):
    exif = Image.Exif()
    exif[0x0112] = value
    return exif


def decoded(data):
    from PIL import ImageOps

    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def open_clip_model(tmp_path_factory):
    """(model, preprocess, tokenizer, checkpoint path): seeded random ViT-S-32 weights saved as a checkpoint."""
    import torch

    open_clip = import_open_clip()
    torch.manual_seed(19)
    model, _, preprocess = open_clip.create_model_and_transforms(ARCHITECTURE, pretrained=None)
    path = tmp_path_factory.mktemp("open_clip") / "vit-s-32-random.pt"
    torch.save(model.state_dict(), path)
    return model.eval(), preprocess, open_clip.get_tokenizer(ARCHITECTURE), str(path)


def build_hf_clip(folder):
    """A small random Hugging Face CLIP folder (CLIPModel, CLIP's tokenizer, CLIPImageProcessor), CLIP's vocabulary."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    simple = import_open_clip().get_tokenizer(ARCHITECTURE)
    names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {names.get(token, token): i for token, i in simple.encoder.items()}
    merges = [pair for pair, _ in sorted(simple.bpe_ranks.items(), key=lambda item: item[1])]
    torch.manual_seed(20)
    config = CLIPConfig(
        text_config={"vocab_size": 49408, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 49406,
                     "eos_token_id": 49407, "pad_token_id": 49407},
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 224, "patch_size": 32},
        projection_dim=32)
    CLIPModel(config).eval().save_pretrained(folder)
    CLIPTokenizer(vocab=vocab, merges=merges).save_pretrained(folder)
    CLIPImageProcessor().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def hf_clip_dir(tmp_path_factory):
    return build_hf_clip(tmp_path_factory.mktemp("hf_clip"))


@pytest.fixture(scope="module")
def clip_server(server, open_clip_model, hf_clip_dir):
    """Both exports beside MiniLM on the shared server, its proxy reloaded with URL fetching on for 127.0.0.1 (the
    image host started below; loopback needs image_url_allow_private)."""
    with proxy_settings(server, image_url_hosts="127.0.0.1", image_url_allow_private="true"), \
            serve_exports(server, {"clip": ["--open-clip", ARCHITECTURE, "--pretrained", open_clip_model[3]],
                                   "hfclip": ["--model", hf_clip_dir]}):
        yield server


def infer(protocol, server, model, name, rows, output="embedding"):
    """One request of BYTES rows to `model` (input `name`); the output array."""
    library = {"http": httpclient, "grpc": grpcclient}[protocol]
    module = client(protocol, url_for(server, protocol))
    tensor = library.InferInput(name, [len(rows), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(rows, dtype=np.object_).reshape(-1, 1))
    result = module.infer(model, [tensor], outputs=[library.InferRequestedOutput(output)])
    return result.as_numpy(output)


def cosines(a, b):
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# ---------------------------------------------------------------- export
def test_export_refuses_what_it_cannot_serve(tmp_path, hf_clip_dir):
    import subprocess

    def run(*args):
        return subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"), "--repository",
                               str(tmp_path), *args], capture_output=True, text=True)

    unknown = run("--open-clip", "ViT-Nonexistent", "--pretrained", "none", "--name", "x")
    assert unknown.returncode != 0 and "not an open_clip architecture" in unknown.stderr
    unnamed = run("--model", hf_clip_dir)
    assert unnamed.returncode != 0 and "needs --name" in unnamed.stderr
    text_flags = run("--model", hf_clip_dir, "--name", "c", "--pooling", "mean")
    assert text_flags.returncode != 0 and "do not apply to CLIP" in text_flags.stderr
    assert not os.listdir(tmp_path)


def test_exported_tokenizer_is_open_clips(open_clip_model):
    """The fast tokenizer built from open_clip's vocabulary and merges gives open_clip.tokenize's ids on texts
    that open_clip's cleaning leaves as they are (the tokenizer model applies the cleaning: tested through Triton)."""
    from exporter.families.clip import fast_tokenizer_of

    _, _, simple, _ = open_clip_model
    fast = fast_tokenizer_of(simple)
    texts = [simple.clean_fn(t) for t in TEXTS] + ["x" * 400, "3.14159 and 42nd", "it's a dog's life"]
    for text in texts:
        theirs = simple([text])[0].tolist()
        ours = fast(text, truncation=True, max_length=77)["input_ids"]
        assert ours == theirs[:len(ours)] and not any(theirs[len(ours):]), text


# ---------------------------------------------------------------- through tritonserver
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_token_ids_are_open_clips(clip_server, open_clip_model, protocol):
    _, _, simple, _ = open_clip_model
    ids = infer(protocol, clip_server, "clip_tokenizer", "text", [t.encode() for t in TEXTS], "input_ids")
    mask = infer(protocol, clip_server, "clip_tokenizer", "text", [t.encode() for t in TEXTS], "attention_mask")
    truncated = infer(protocol, clip_server, "clip_tokenizer", "text", [t.encode() for t in TEXTS], "truncated")
    expected = simple(TEXTS).numpy()
    for row, text in enumerate(TEXTS):
        ours = ids[row][mask[row].astype(bool)].tolist()
        assert ours == expected[row][:len(ours)].tolist() and not expected[row][len(ours):].any(), text
    assert truncated.reshape(-1).tolist() == [len(simple.encode(simple.clean_fn(t))) + 2 > 77 for t in TEXTS]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_vectors_are_open_clips(clip_server, open_clip_model, protocol):
    import torch

    model, _, simple, _ = open_clip_model
    with torch.no_grad():
        expected = model.encode_text(simple(TEXTS), normalize=True).numpy()
    got = infer(protocol, clip_server, "clip", "text", [t.encode() for t in TEXTS])
    assert got.shape == expected.shape
    assert cosines(got, expected).min() >= MIN_COSINE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_image_vectors_are_open_clips(clip_server, open_clip_model, protocol):
    """Raw bytes in (JPEG, PNG with alpha, grayscale, WebP, animated GIF, EXIF-rotated JPEG), open_clip's vectors
    out: preprocess and encode_image of the decoded (EXIF-transposed) image."""
    import torch

    model, preprocess, _, _ = open_clip_model
    images = sample_images()
    with torch.no_grad():
        pixels = torch.stack([preprocess(decoded(data)) for data in images.values()])
        expected = model.encode_image(pixels, normalize=True).numpy()
    got = infer(protocol, clip_server, "clip_image", "image", list(images.values()))
    assert got.shape == expected.shape and got.shape[0] == len(images)
    worst = cosines(got, expected)
    assert worst.min() >= MIN_COSINE, dict(zip(images, worst))


def test_text_and_image_share_one_space(clip_server, open_clip_model):
    """Text-to-image scores from the server equal open_clip's own (same ranking of images for each text)."""
    import torch

    model, preprocess, simple, _ = open_clip_model
    images = sample_images()
    texts = ["a red square", "blue and green shapes", "random noise"]
    with torch.no_grad():
        image_vectors = model.encode_image(torch.stack([preprocess(decoded(d)) for d in images.values()]),
                                           normalize=True).numpy()
        text_vectors = model.encode_text(simple(texts), normalize=True).numpy()
    served = infer("grpc", clip_server, "clip", "text", [t.encode() for t in texts]) @ \
        infer("grpc", clip_server, "clip_image", "image", list(images.values())).T
    expected = text_vectors @ image_vectors.T
    assert np.abs(served - expected).max() < 1e-4
    assert (np.argsort(-served, axis=1) == np.argsort(-expected, axis=1)).all()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hugging_face_clip_matches_transformers(clip_server, hf_clip_dir, protocol):
    import torch
    from transformers import CLIPModel, CLIPTokenizer
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    model = CLIPModel.from_pretrained(hf_clip_dir).eval()
    tokenizer = CLIPTokenizer.from_pretrained(hf_clip_dir)
    processor = CLIPImageProcessorPil.from_pretrained(hf_clip_dir)  # the PIL one, whatever torchvision says
    images = sample_images()
    with torch.no_grad():
        batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text = torch.nn.functional.normalize(model.get_text_features(**batch).pooler_output, dim=-1).numpy()
        pixels = processor([decoded(d) for d in images.values()], return_tensors="pt")["pixel_values"]
        image = torch.nn.functional.normalize(model.get_image_features(pixel_values=pixels).pooler_output,
                                              dim=-1).numpy()
    assert cosines(infer(protocol, clip_server, "hfclip", "text", [t.encode() for t in TEXTS]), text).min() \
        >= MIN_COSINE
    got = infer(protocol, clip_server, "hfclip_image", "image", list(images.values()))
    assert cosines(got, image).min() >= MIN_COSINE


def truncated_png():
    data = encode(Image.new("RGB", (300, 300), (1, 2, 3)), "PNG")
    return data[:len(data) // 2]


def bomb_png(width=100_000, height=100_000):
    """A PNG whose header declares width x height pixels: a few dozen bytes."""
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")


HOSTILE = {
    "not an image": (b"%PDF-1.4 this is not an image at all", "not an image"),
    "empty": (b"", "empty"),
    "truncated": (truncated_png(), "truncated"),
    "bomb": (bomb_png(), "pixels"),
    "jpeg header only": (encode(Image.new("RGB", (64, 64)), "JPEG")[:200], "truncated"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hostile_images_are_refused_and_the_stub_lives(clip_server, protocol):
    """Each hostile image gets its own error naming the cause, while good images sent at the same moment get their
    vectors, and the image model keeps serving afterwards."""
    from tritonclient.utils import InferenceServerException

    good = sample_images()["noise.jpg"]
    reference = infer(protocol, clip_server, "clip_image", "image", [good])

    def send(rows):
        try:
            return infer(protocol, clip_server, "clip_image", "image", rows)
        except InferenceServerException as error:
            return error

    with concurrent.futures.ThreadPoolExecutor(len(HOSTILE) * 2) as pool:
        bad = {name: pool.submit(send, [data]) for name, (data, _) in HOSTILE.items()}
        fine = [pool.submit(send, [good]) for _ in HOSTILE]
        for name, future in bad.items():
            error = future.result()
            assert isinstance(error, InferenceServerException), name
            assert HOSTILE[name][1] in error.message().lower(), (name, error.message())
            assert "image[0]" in error.message(), error.message()
        for future in fine:
            assert cosines(future.result(), reference).min() > 0.99999
    assert cosines(infer(protocol, clip_server, "clip_image", "image", [good]), reference).min() > 0.99999


# ---------------------------------------------------------------- the HTTP side (proxy)
ADMIN = {"Authorization": f"Bearer {SHARED_ADMIN_KEY}"}


@pytest.fixture(scope="module")
def image_host():
    """A local HTTP server with the sample images at /NAME and a redirect to a host not on the allow-list."""
    import http.server
    import threading

    images = sample_images()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/elsewhere":
                self.send_response(302)
                self.send_header("Location", "http://localhost:9/red.png")
                self.end_headers()
                return
            data = images.get(self.path.lstrip("/"))
            self.send_response(200 if data else 404)
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def b64(data):
    import base64

    return base64.b64encode(data).decode()


def test_seed_infer_gives_the_kserve_vectors(clip_server):
    """The seed's POST /infer: text and image lists in one request, both lists out, in order, equal to what KServe
    clients get from `clip` and `clip_image`."""
    import httpx

    images = sample_images()
    texts = TEXTS[:3]
    body = {"text": texts, "image": [b64(images["red.png"]), "data:image/jpeg;base64," + b64(images["noise.jpg"])]}
    response = httpx.post(clip_server.proxy_url + "/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    result = response.json()
    assert isinstance(result["processingTimeMs"], float) and result["processingTimeMs"] > 0
    expected_text = infer("grpc", clip_server, "clip", "text", [t.encode() for t in texts])
    expected_image = infer("grpc", clip_server, "clip_image", "image", [images["red.png"], images["noise.jpg"]])
    assert cosines(np.array(result["text_embeddings"]), expected_text).min() > 0.99999
    assert cosines(np.array(result["image_embeddings"]), expected_image).min() > 0.99999


def test_openai_route_takes_images_beside_texts(clip_server, image_host):
    """/v1/embeddings with strings and {"image": ...} items (base64 and a URL from an allow-listed host): rows in input
    order, each equal to its KServe vector; a hostile item is a 400 naming it, and the next request is served."""
    import httpx

    images = sample_images()
    items = ["a red square", {"image": b64(images["red.png"])}, {"image": f"{image_host}/shapes.webp"},
             {"text": "blue and green shapes"}]
    response = httpx.post(clip_server.proxy_url + "/v1/embeddings", json={"model": "clip", "input": items},
                          timeout=60)
    assert response.status_code == 200, response.text
    rows = np.array([row["embedding"] for row in sorted(response.json()["data"], key=lambda r: r["index"])])
    texts = infer("grpc", clip_server, "clip", "text", [b"a red square", b"blue and green shapes"])
    pictures = infer("grpc", clip_server, "clip_image", "image", [images["red.png"], images["shapes.webp"]])
    assert cosines(rows, np.stack([texts[0], pictures[0], pictures[1], texts[1]])).min() > 0.99999
    bad = httpx.post(clip_server.proxy_url + "/v1/embeddings", timeout=60,
                     json={"model": "clip", "input": ["fine", {"image": b64(HOSTILE["truncated"][0])}]})
    assert bad.status_code == 400 and "input[1]" in bad.text and "truncated" in bad.text.lower(), bad.text
    redirected = httpx.post(clip_server.proxy_url + "/v1/embeddings", timeout=60,
                            json={"model": "clip", "input": [{"image": f"{image_host}/elsewhere"}]})
    assert redirected.status_code == 400 and "localhost" in redirected.text, redirected.text
    again = httpx.post(clip_server.proxy_url + "/v1/embeddings", timeout=60,
                       json={"model": "clip", "input": [{"image": b64(images["red.png"])}]})
    assert again.status_code == 200


def test_seed_admin_routes_unload_and_load_the_export(clip_server, open_clip_model):
    """/unload_clip_model and /load_clip_model (admin key) act on the export of that architecture and checkpoint;
    an export that does not exist is a 404 that gives the export command."""
    import httpx

    proxy = clip_server.proxy_url
    wanted = {"model_name": ARCHITECTURE, "pretrained": open_clip_model[3]}
    assert httpx.post(proxy + "/unload_clip_model", json=wanted, timeout=60).status_code in (401, 403)
    missing = httpx.post(proxy + "/load_clip_model", json={"model_name": "ViT-L-14", "pretrained": "openai"},
                         headers=ADMIN, timeout=60)
    assert missing.status_code == 404 and "build/export.py --open-clip ViT-L-14" in missing.text, missing.text
    # Bad images first, through both doors (the tests above sent more): they must not hold the preprocessing model.
    # Issue 58: its error's traceback kept the requests, and the model stayed UNLOADING: the unload answered after
    # request_timeout_s (60 s) and the load started a second stub beside the stuck one.
    bad = httpx.post(proxy + "/v1/embeddings", timeout=60,
                     json={"model": "clip", "input": [{"image": b64(HOSTILE["truncated"][0])}] * 2})
    assert bad.status_code == 400, bad.text
    with pytest.raises(Exception, match="could not be decoded"):
        infer("http", clip_server, "clip_image", "image", [HOSTILE["truncated"][0]])
    unloaded = httpx.post(proxy + "/unload_clip_model", json=wanted, headers=ADMIN, timeout=120)
    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.json()["seconds"] < 30, unloaded.text  # not the 60 s of a model that never unloads
    states = {model["name"]: model.get("state") for model in repository_index(clip_server)}
    assert states["clip_image_preprocess"] == "UNAVAILABLE", states
    gone = httpx.post(proxy + "/infer", json={"model": "clip", "text": ["a cat"]}, timeout=60)
    assert gone.status_code == 404, gone.text
    loaded = httpx.post(proxy + "/load_clip_model", json=wanted, headers=ADMIN, timeout=240)
    assert loaded.status_code == 200 and loaded.json()["model"] == "clip", loaded.text
    stubs = [argv for argv in stub_argvs(clip_server) if "/clip_image_preprocess/" in argv]
    assert len(stubs) == 1, stubs  # one instance (CPU config), not a second beside a stuck one
    back = httpx.post(proxy + "/infer", json={"model": "clip", "text": ["a cat"], "image": [
        b64(sample_images()["red.png"])]}, timeout=60)
    assert back.status_code == 200 and len(back.json()["image_embeddings"]) == 1, back.text


def repository_index(server):
    """Triton's repository index (its restricted API: the launcher's admin key, the one the proxy's admin holds)."""
    import json
    import urllib.request

    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST",
                                     headers={"admin-key": ADMIN["Authorization"].removeprefix("Bearer ")})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def stub_argvs(server):
    """The command lines of tritonserver's live stub processes (each names its model's folder)."""
    from local_triton import launch

    return [b" ".join(argv).decode(errors="replace") for state, argv in launch.children(server.process.pid).values()
            if state != "Z"]
