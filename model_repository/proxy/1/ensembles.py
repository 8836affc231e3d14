"""The served embedding ensembles as the routes see them (app.Service): discovery in the model repository, inference
through BLS, readiness, and the admin actions. Runs in the proxy's stub; triton_python_backend_utils is handed in.

A model is an export (build/export.py): an ensemble whose version folder holds export.json, plus its tokenizer and
encoder models. The repository is scanned at start, when an unknown id is asked for, and before admin actions, so
models exported or loaded after start-up are found.
"""
import asyncio
import glob
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass

import numpy as np

from app import ApiError

TEXT_ERROR = re.compile(r"text\[(\d+)\] (.+)")  # the tokenizer's per-text messages
OVER_BUDGET = ("tokenizer parameter max_batch_tokens", "tokenizer parameter max_request_bytes")
NOT_AVAILABLE = ("unknown model", "not ready", "unavailable", "server is stopping", "not found")
TENSORS = {"dense": ("embedding",), "sparse": ("sparse_indices", "sparse_values", "sparse_count"),
           "colbert": ("colbert_vectors", "colbert_length")}
SCALARS = {"num_tokens", "truncated", "sparse_count", "colbert_length"}  # [rows, 1] outputs: one value per text
RESCAN_S = 2.0  # an unknown id triggers a repository scan at most this often


@dataclass(frozen=True)
class Card:
    id: str
    name: str  # the ensemble
    tokenizer: str
    encoder: str
    outputs: tuple[str, ...]
    embedding_size: int | None
    colbert_size: int | None
    max_length: int
    max_batch_size: int
    source: str
    created: int

    @property
    def models(self):
        return self.name, self.tokenizer, self.encoder


@dataclass
class Embeddings:
    dense: np.ndarray | None
    sparse: list | None
    colbert: list | None
    tokens: np.ndarray
    truncated: np.ndarray
    inference_ms: float


def read_card(repository, name):
    """The Card of the export whose ensemble is `name`, or None."""
    path = os.path.join(repository, name, "1", "export.json")
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        with open(os.path.join(repository, name, "config.pbtxt"), encoding="utf-8") as handle:
            rows = int(re.search(r"^max_batch_size:\s*(\d+)", handle.read(), re.M).group(1))
        return Card(manifest["id"], manifest["name"], manifest["tokenizer_model"], manifest["encoder_model"],
                    tuple(manifest["outputs"]), manifest.get("embedding_size"), manifest.get("colbert_size"),
                    int(manifest["max_length"]), rows, manifest["model"], int(os.path.getmtime(path)))
    except (OSError, ValueError, KeyError, AttributeError):
        return None


class Ensembles:
    def __init__(self, pb_utils, repository, settings, executor):
        self.pb_utils, self.repository, self.settings, self.executor = pb_utils, repository, settings, executor
        self.cards_by_name, self.scanned = {}, 0.0
        self.ready = {}  # Triton model name -> ready, kept by the watchdog (no IPC on the request path)
        # explicit mode: what was meant to be loaded (LOAD_MODELS) and what the admin routes changed since
        self.startup = None if settings.load_models == "*" else set(settings.load_models.split(","))
        self.loaded_by_admin, self.unloaded_by_admin = set(), set()
        self.recovering = {}  # Triton model name -> why (a dead stub being reloaded)
        self.failed = ""  # set when a dead stub could not be recovered: not live
        self.draining = False
        self.inflight = set()  # (models, abort future) of each BLS call in flight
        self.loop = None  # the HTTP server's event loop, known from the first call
        self.admin_lock = threading.Lock()
        self.scan()

    # ---------------------------------------------------------------- discovery and state
    def scan(self):
        cards = {}
        for manifest in glob.glob(os.path.join(self.repository, "*", "1", "export.json")):
            card = read_card(self.repository, os.path.basename(os.path.dirname(os.path.dirname(manifest))))
            if card is not None:
                cards[card.name] = card
        self.cards_by_name, self.scanned = cards, time.monotonic()
        return cards

    def find(self, model_id):
        for _ in range(2):
            for card in self.cards_by_name.values():
                if model_id in (card.id, card.name):
                    return card
            if time.monotonic() - self.scanned < RESCAN_S:
                return None
            self.scan()
        return None

    def is_ready(self, card):
        return all(self.ready.get(name) for name in card.models)

    def expected(self, card):
        """Whether the model should be loaded now (else asking for it is a 404, as OpenAI answers)."""
        if card.name in self.unloaded_by_admin:
            return False
        return card.name in self.loaded_by_admin or self.startup is None or card.name in self.startup

    def default_card(self):
        if self.settings.default_model:
            return self.find(self.settings.default_model)
        ready = [c for c in self.cards_by_name.values() if self.expected(c)]
        named = [c for c in ready if c.name == "ensemble"]
        return (named or sorted(ready, key=lambda c: c.name) or [None])[0]

    def resolve(self, model):
        card = self.find(model) if model else self.default_card()
        if card is None:
            if not model:
                raise ApiError(503, "no model is served: export one (build/export.py)", "model_not_found")
            served = ", ".join(sorted(c.id for c in self.cards())) or "none"
            raise ApiError(404, f"model '{model}' is not served here (served: {served})", "model_not_found", "model")
        dead = [self.recovering[m] for m in card.models if m in self.recovering]
        if dead:
            raise ApiError(503, f"model '{card.id}' is recovering: {dead[0]}", "model_not_ready", "model",
                           headers={"Retry-After": "2"})
        if not self.is_ready(card):
            if not self.expected(card):
                raise ApiError(404, f"model '{card.id}' is not loaded (POST /v1/models/{card.id}/load)",
                               "model_not_found", "model")
            raise ApiError(503, f"model '{card.id}' is not ready (loading)", "model_not_ready", "model",
                           headers={"Retry-After": "1"})
        return card

    def cards(self):
        return sorted((c for c in self.cards_by_name.values() if self.is_ready(c)), key=lambda c: c.id)

    def health(self):
        if self.draining:
            return False, "shutting down"
        if self.failed:
            return False, self.failed
        card = self.default_card()
        if card is None:
            return False, "no model is served"
        if not self.is_ready(card):
            missing = [m for m in card.models if not self.ready.get(m)]
            why = "; ".join(self.recovering.get(m, f"{m} is not ready") for m in missing)
            return False, f"model '{card.id}' is not ready: {why}"
        return True, "ok"

    def live(self):
        return (False, self.failed) if self.failed else (True, "ok")

    def abort_inflight(self, model, reason):
        """From the watchdog's thread: fail (503) the calls waiting on a model whose stub died."""
        def abort():
            for models, future in list(self.inflight):
                if model in models and not future.done():
                    future.set_exception(ApiError(503, reason + "; retry", "model_not_ready",
                                                  headers={"Retry-After": "2"}))
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(abort)

    def refresh_readiness(self):
        """Called by the watchdog's thread: one is_model_ready per model, so requests never wait on it."""
        for card in list(self.cards_by_name.values()):
            for name in card.models:
                try:
                    self.ready[name] = bool(self.pb_utils.is_model_ready(name))
                except Exception:  # noqa: BLE001 - the server is stopping, or the model is gone
                    self.ready[name] = False

    # ---------------------------------------------------------------- inference
    async def embed(self, card, texts, outputs, param):
        started = time.perf_counter()
        names = [t for kind in outputs for t in TENSORS[kind]] + ["num_tokens", "truncated"]
        encoded = []
        for i, text in enumerate(texts):
            try:
                encoded.append(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ApiError(400, f"{param}[{i}] is not valid Unicode (lone surrogate)", "invalid_text",
                               param) from None
        step = card.max_batch_size
        parts = await asyncio.gather(*(self.infer(card, encoded[i:i + step], i, names, param)
                                       for i in range(0, len(encoded), step)))
        rows = [row for part in parts for row in part]
        inference_ms = (time.perf_counter() - started) * 1000
        return Embeddings(
            dense=np.stack([r["embedding"] for r in rows]) if "dense" in outputs else None,
            sparse=[(r["sparse_indices"][:r["sparse_count"]], r["sparse_values"][:r["sparse_count"]])
                    for r in rows] if "sparse" in outputs else None,
            colbert=[r["colbert_vectors"][:r["colbert_length"]] for r in rows] if "colbert" in outputs else None,
            tokens=np.array([r["num_tokens"] for r in rows], dtype=np.int64),
            truncated=np.array([r["truncated"] for r in rows], dtype=bool), inference_ms=inference_ms)

    async def infer(self, card, texts, offset, names, param):
        """One BLS request (at most the ensemble's max_batch_size texts) -> one dict of outputs per text. A chunk
        over the tokenizer's token budget is split in two and retried."""
        pb = self.pb_utils
        request = pb.InferenceRequest(
            model_name=card.name, requested_output_names=names,
            inputs=[pb.Tensor("text", np.array(texts, dtype=np.object_).reshape(-1, 1))],
            # Outputs come back in host memory even when the encoder runs on a GPU (as_numpy needs that).
            preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
        self.loop = loop = asyncio.get_running_loop()
        future, abort = loop.run_in_executor(self.executor, request.exec), loop.create_future()
        entry = (card.models, abort)
        self.inflight.add(entry)
        try:
            done, _ = await asyncio.wait({future, abort}, timeout=self.settings.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.inflight.discard(entry)
        if abort in done:  # its stub died: that call will never return (its thread stays blocked)
            raise abort.exception()
        if not done:
            raise ApiError(504, f"inference did not finish within {self.settings.request_timeout_s:g} s (setting "
                                f"request_timeout_s)", "inference_timeout")
        try:
            response = future.result()
        except Exception as error:  # noqa: BLE001 - BLS refused: the model is stopping or not there
            raise ApiError(503, f"model '{card.id}' is not available: {error}", "model_not_ready",
                           headers={"Retry-After": "1"}) from None
        if response.has_error():
            message = response.error().message()
            if any(marker in message for marker in OVER_BUDGET) and len(texts) > 1:
                half = len(texts) // 2
                return (await self.infer(card, texts[:half], offset, names, param) +
                        await self.infer(card, texts[half:], offset + half, names, param))
            bad_text = TEXT_ERROR.search(message)
            if bad_text:
                raise ApiError(400, f"{param}[{offset + int(bad_text[1])}] {bad_text[2]}", "invalid_input", param)
            if any(marker in message.lower() for marker in NOT_AVAILABLE):
                raise ApiError(503, f"model '{card.id}' is not available: {message}", "model_not_ready",
                               headers={"Retry-After": "1"})
            raise ApiError(500, f"inference failed: {message}", "inference_failed")
        arrays = {name: pb.get_output_tensor_by_name(response, name).as_numpy() for name in names}
        return [{name: array[i].item() if name in SCALARS else array[i] for name, array in arrays.items()}
                for i in range(len(texts))]

    # ---------------------------------------------------------------- admin
    async def load(self, model_id):
        return await asyncio.get_running_loop().run_in_executor(None, self.load_now, model_id)

    async def unload(self, model_id):
        return await asyncio.get_running_loop().run_in_executor(None, self.unload_now, model_id)

    async def delete(self, model_id):
        return await asyncio.get_running_loop().run_in_executor(None, self.delete_now, model_id)

    def admin_card(self, model_id):
        self.scan()
        card = self.find(model_id)
        if card is None:
            raise ApiError(404, f"no export named '{model_id}' in the model repository", "model_not_found")
        if self.settings.model_control != "explicit":
            raise ApiError(409, "models load and unload only with MODEL_CONTROL=explicit", "model_control_off")
        return card

    def load_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            self.unloaded_by_admin.discard(card.name)
            self.loaded_by_admin.add(card.name)
            try:
                self.pb_utils.load_model(model_name=card.name)  # the ensemble brings its steps
            except Exception as error:  # noqa: BLE001 - Triton says why (missing file, bad config...)
                self.loaded_by_admin.discard(card.name)
                raise ApiError(422, f"model '{card.id}' did not load: {error}", "load_failed") from None
            self.refresh_readiness()
            return time.monotonic() - started

    def unload_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            self.unloaded_by_admin.add(card.name)  # from now on new requests get 404
            self.loaded_by_admin.discard(card.name)
            # Triton lets the requests in flight finish before the models go; the steps go with the ensemble.
            self.pb_utils.unload_model(model_name=card.name, unload_dependents=True)
            deadline = time.monotonic() + self.settings.request_timeout_s
            while any(self.pb_utils.is_model_ready(m) for m in card.models) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.refresh_readiness()
            return time.monotonic() - started

    def delete_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            if any(self.pb_utils.is_model_ready(m) for m in card.models):
                raise ApiError(409, f"model '{card.id}' is loaded: unload it first", "model_loaded")
            if card.name == "ensemble":
                raise ApiError(409, "the default export (tokenizer/embedding/ensemble) is part of the project's "
                                    "layout: re-export over it instead", "model_protected")
            for name in card.models:
                folder = os.path.join(self.repository, name)
                if not os.access(self.repository, os.W_OK) or not os.access(folder, os.W_OK):
                    raise ApiError(409, f"the model repository is read-only: cannot delete '{card.id}'",
                                   "repository_read_only")
            for name in card.models:
                shutil.rmtree(os.path.join(self.repository, name))
            self.unloaded_by_admin.discard(card.name)
            self.scan()
            return time.monotonic() - started
