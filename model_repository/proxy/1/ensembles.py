"""The served embedding ensembles as the routes see them (app.Service): discovery in the model repository, inference
through BLS, readiness, and the admin actions. Runs in the proxy's stub; triton_python_backend_utils is handed in.

A model is an export (build/export.py): an ensemble whose version folder holds export.json, plus its tokenizer and
encoder models. The repository is scanned at start, when an unknown id is asked for, and before admin actions, so
models exported or loaded after start-up are found.
"""
import asyncio
import contextlib
import glob
import http.client
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np

from app import ApiError

# the tokenizer's per-text messages (through the ensemble prefixed "in ensemble '<name>', ")
TEXT_ERROR = re.compile(r"text\[(\d+)\] (.+)", re.S)
RERANK_ERROR = re.compile(r"^(query|documents\[\d+\]|documents|weights) ")  # the rerank model's bad-input messages
QUEUE_FULL = "exceeds maximum queue size"  # Triton's refusal under a queue policy's max_queue_size (UNAVAILABLE)
NOT_AVAILABLE = ("unknown model", "not ready", "unavailable", "server is stopping", "not found")
TENSORS = {"dense": ("embedding",), "sparse": ("sparse_indices", "sparse_values", "sparse_count"),
           "colbert": ("colbert_vectors", "colbert_length")}
RESCAN_S = 2.0  # an unknown id triggers a repository scan at most this often
HTTP_GRACE_S = 60.0  # readiness falls back to pb_utils.is_model_ready if Triton's HTTP never answered by then
LOAD_TIMEOUT_S = 900.0  # a load through Triton's repository API answers when the model is loaded (bge-m3: minutes)


@dataclass(frozen=True)
class Card:
    id: str
    name: str  # the ensemble
    tokenizer: str
    encoder: str
    bls: str  # the ensemble's BLS twin: many texts in length groups
    rerank: str
    outputs: tuple[str, ...]
    embedding_size: int | None
    colbert_size: int | None
    max_length: int
    bls_rows: int  # the BLS model's max_batch_size: texts per call
    source: str
    created: int

    @property
    def models(self):
        return self.name, self.tokenizer, self.encoder, self.bls, self.rerank


@dataclass
class Embeddings:
    dense: np.ndarray | None
    sparse: list | None
    colbert: list | None
    tokens: np.ndarray
    truncated: np.ndarray
    inference_ms: float


@dataclass
class RerankResult:
    scores: np.ndarray
    mode_scores: np.ndarray  # [n, 3]: dense, sparse, ColBERT; NaN where the model does not serve the mode
    tokens: int
    query_truncated: bool
    truncated: np.ndarray
    inference_ms: float


def triton_http(pid):
    """(host, port, headers) of the HTTP frontend of the tritonserver process `pid`, from its command line (headers:
    the key of its restricted repository API, `--http-restricted-api=<apis>:<header>=<key>`); None when off."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    flags, headers = {}, {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, equals, value = arg[2:].partition("=")
            flags[key] = value = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
            apis, _, header = value.partition(":")
            if key == "http-restricted-api" and "model-repository" in apis.split(","):
                name, _, secret = header.partition("=")
                headers[name] = secret
    if flags.get("allow-http", "true").lower() in ("false", "0", "no"):
        return None
    address = flags.get("http-address", "0.0.0.0")
    host = "127.0.0.1" if address in ("0.0.0.0", "", "::", "[::]") else address
    try:
        return host, int(flags.get("http-port", "8000")), headers
    except ValueError:
        return None


def read_card(repository, name):
    """The Card of the export whose ensemble is `name`, or None (also for an export older than the BLS and rerank
    models: export it again)."""
    path = os.path.join(repository, name, "1", "export.json")
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        try:  # (an incomplete export still has a card: its load says what is missing)
            with open(os.path.join(repository, manifest["bls_model"], "config.pbtxt"), encoding="utf-8") as handle:
                rows = int(re.search(r"^max_batch_size:\s*(\d+)", handle.read(), re.M).group(1))
        except OSError:
            rows = 1
        return Card(manifest["id"], manifest["name"], manifest["tokenizer_model"], manifest["encoder_model"],
                    manifest["bls_model"], manifest["rerank_model"], tuple(manifest["outputs"]),
                    manifest.get("embedding_size"), manifest.get("colbert_size"), int(manifest["max_length"]), rows,
                    manifest["model"], int(os.path.getmtime(path)))
    except (OSError, ValueError, KeyError, AttributeError):
        return None


class Ensembles:
    def __init__(self, pb_utils, repository, settings, executor):
        self.pb_utils, self.repository, self.settings, self.executor = pb_utils, repository, settings, executor
        self.cards_by_name, self.scanned = {}, 0.0
        self.ready = {}  # Triton model name -> ready, kept by the readiness thread (no IPC on the request path)
        # explicit mode: what was meant to be loaded (LOAD_MODELS) and what the admin routes changed since
        self.startup = {name.strip() for name in settings.load_models.split(",")}
        self.loaded_by_admin, self.unloaded_by_admin = set(), set()
        self.failed = ""  # set when half the BLS threads are stranded on dead stubs: not live
        self.draining = False
        self.inflight = set()  # (models, abort future) of each BLS call in flight
        self.loop = None  # the HTTP server's event loop, known from the first call
        self.admin_lock = threading.Lock()
        self.triton_started = False  # set by the readiness thread once Triton's start-up is over
        self.changing_models = set()  # Triton models an admin load/unload is changing now (see changing())
        # Readiness, load and unload go through Triton's own HTTP frontend (GET /v2/models/<name>/ready, the
        # repository API), not through pb_utils' is_model_ready / load_model / unload_model: in python_backend
        # r24.07 those model-loader messages corrupt the stub's shared-memory allocator now and then (the proxy's
        # stub dies in rbtree_best_fit::priv_deallocate; fixed upstream in python_backend b49d9e2, 2025): polled
        # every second, tritonserver aborted at every shutdown (boost lock_exception), and a second failed load
        # through pb_utils killed the proxy's stub. pb_utils remains the fallback where HTTP is off.
        self.http_endpoint = triton_http(os.getppid())
        self.http_seen, self.started = False, time.monotonic()
        self.scan()
        if "*" in self.startup:  # what the server loaded at start: the exports there now (later ones wait for a load)
            self.startup = set(self.cards_by_name)

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
        return card.name in self.loaded_by_admin or card.name in self.startup

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
            why = "; ".join(f"{m} is not ready" for m in missing)
            return False, f"model '{card.id}' is not ready: {why}"
        return True, "ok"

    def live(self):
        return (False, self.failed) if self.failed else (True, "ok")

    def abort_inflight(self, model, reason):
        """From the readiness thread: fail (503) the calls waiting on `model`; returns their BLS calls (futures)."""
        calls = [(abort, call) for models, abort, call in list(self.inflight) if model in models]

        def abort():
            for waiting, _ in calls:
                if not waiting.done():
                    waiting.set_exception(ApiError(503, reason + "; retry", "model_not_ready",
                                                   headers={"Retry-After": "2"}))
        if calls and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(abort)
        return [call for _, call in calls]

    def refresh_readiness(self):
        """Called by the readiness thread (and after admin actions): one readiness question per model, so requests
        never wait on it."""
        for card in list(self.cards_by_name.values()):
            for name in card.models:
                self.ready[name] = self.model_ready(name)

    def model_ready(self, name):
        """Whether Triton has `name` loaded and ready: its HTTP frontend's answer; until that frontend is up (it
        opens once the start-up models are loaded) the answer is no. Without one, pb_utils.is_model_ready."""
        ready = self.http_ready(name) if self.http_endpoint else None
        if ready is not None:
            self.http_seen = True
            return ready
        if self.http_endpoint and (self.http_seen or time.monotonic() - self.started < HTTP_GRACE_S):
            return False  # not up yet, or stopping
        try:
            return bool(self.pb_utils.is_model_ready(name))
        except Exception:  # noqa: BLE001 - the server is stopping, or the model is gone
            return False

    def http_ready(self, name):
        """True / False from GET /v2/models/<name>/ready; None if the frontend did not answer."""
        answer = self.triton("GET", f"/v2/models/{quote(name, safe='')}/ready")
        return None if answer is None else answer[0] == 200

    def triton(self, method, path, body=None, headers=None, timeout=5.0):
        """One call to Triton's HTTP frontend: (status, body), or None when it does not answer (not up yet,
        stopping, or off). A connection per call, closed after it: at shutdown Triton waits (up to its exit
        timeout) for the HTTP connections open to it to close before it unloads the models."""
        if not self.http_endpoint:
            return None
        connection = http.client.HTTPConnection(*self.http_endpoint[:2], timeout=timeout)
        try:
            connection.request(method, path, body, {**(headers or {}), "Connection": "close"})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def repository_api(self, path, body=b"{}", timeout=5.0):
        """Triton's repository API (restricted: its key is on tritonserver's command line, where the launcher puts
        ADMIN_API_KEY): (status, body), or None when it is off or refuses the key."""
        headers = {"Content-Type": "application/json", **(self.http_endpoint[2] if self.http_endpoint else {})}
        answer = self.triton("POST", f"/v2/repository{path}", body, headers, timeout)
        return None if answer is None or answer[0] == 403 else answer

    def model_control(self, action, name, unload_dependents=False):
        """Load (waits until loaded) or unload (returns at once) `name` with Triton's repository API, else with
        pb_utils. Raises RuntimeError with Triton's message when it fails."""
        body = json.dumps({"parameters": {"unload_dependents": True}} if unload_dependents else {}).encode()
        answer = self.repository_api(f"/models/{quote(name, safe='')}/{action}", body, LOAD_TIMEOUT_S)
        if answer is None:
            if action == "load":
                self.pb_utils.load_model(model_name=name)
            else:
                self.pb_utils.unload_model(model_name=name, unload_dependents=unload_dependents)
            return
        if answer[0] != 200:
            try:
                message = json.loads(answer[1])["error"]
            except (ValueError, KeyError, TypeError):
                message = answer[1].decode(errors="replace")
            raise RuntimeError(message)

    def model_states(self):
        """{model: set of its versions' states} from Triton's repository index, or None when not available."""
        answer = self.repository_api("/index")
        if answer is None or answer[0] != 200:
            return None
        states = {}
        try:
            for entry in json.loads(answer[1]):
                states.setdefault(entry["name"], set()).add(entry.get("state", ""))
        except (ValueError, KeyError, TypeError):
            return None
        return states

    def in_use(self, models):
        """Whether Triton holds any of `models`: loaded, loading, or still unloading (an unload returns at once and
        a model stops being ready at once, but its instances finish their requests and finalize first). Triton's
        repository index says; without it: ready."""
        states = self.model_states()
        if states is not None:
            return any(states.get(m, set()) & {"READY", "LOADING", "UNLOADING"} for m in models)
        return any(self.model_ready(m) for m in models)

    def wait_unloaded(self, models):
        deadline = time.monotonic() + self.settings.request_timeout_s
        while models and self.in_use(models) and time.monotonic() < deadline:
            time.sleep(0.1)

    # ---------------------------------------------------------------- inference
    async def embed(self, card, texts, outputs, param):
        """Texts through the export's BLS model (it cuts them into length groups inside Triton), in pieces of its
        max_batch_size rows when there are more; one text through the ensemble (no grouping to do, and the BLS
        model's extra hops cost ~1 ms per request)."""
        started = time.perf_counter()
        names = [t for kind in outputs for t in TENSORS[kind]] + ["num_tokens", "truncated"]
        encoded = []
        for i, text in enumerate(texts):
            try:
                encoded.append(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ApiError(400, f"{param}[{i}] is not valid Unicode (lone surrogate)", "invalid_text",
                               param) from None

        def row_error(row, first):
            return f"{param}[{first + row}]", param

        pieces = range(0, len(encoded), card.bls_rows)
        model = card.bls if len(encoded) > 1 else card.name
        parts = await asyncio.gather(*(
            self.infer(card, model, {"text": np.array(encoded[first:first + card.bls_rows],
                                                         dtype=np.object_).reshape(-1, 1)},
                       names, lambda row, first=first: row_error(row, first)) for first in pieces))
        arrays = {name: [part[name] for part in parts] for name in names}
        rows = {name: [row for part in arrays[name] for row in part] for name in names}
        inference_ms = (time.perf_counter() - started) * 1000
        return Embeddings(
            dense=np.concatenate(arrays["embedding"]) if "dense" in outputs else None,
            sparse=[(ids[:int(n)], weights[:int(n)]) for ids, weights, n in
                    zip(rows["sparse_indices"], rows["sparse_values"], np.concatenate(arrays["sparse_count"]))]
            if "sparse" in outputs else None,
            colbert=[vectors[:int(n)] for vectors, n in zip(rows["colbert_vectors"],
                                                             np.concatenate(arrays["colbert_length"]))]
            if "colbert" in outputs else None,
            tokens=np.concatenate(arrays["num_tokens"]).reshape(-1).astype(np.int64),
            truncated=np.concatenate(arrays["truncated"]).reshape(-1).astype(bool), inference_ms=inference_ms)

    async def rerank(self, card, query, documents, weights):
        """The export's rerank model: (combined scores [n], per-mode scores [n, 3], tokens, query truncated,
        documents truncated [n], inference ms)."""
        started = time.perf_counter()
        try:
            inputs = {"query": np.array([query.encode("utf-8")], dtype=np.object_),
                      "documents": np.array([d.encode("utf-8") for d in documents], dtype=np.object_),
                      "weights": np.array(weights, dtype=np.float32)}
        except UnicodeEncodeError:
            raise ApiError(400, "the query or a document is not valid Unicode (lone surrogate)", "invalid_text",
                           "documents") from None
        names = ["scores", "mode_scores", "num_tokens", "query_truncated", "truncated"]
        result = await self.infer(card, card.rerank, inputs, names, None)
        return RerankResult(result["scores"], result["mode_scores"], int(result["num_tokens"][0]),
                            bool(result["query_truncated"][0]), result["truncated"].astype(bool),
                            (time.perf_counter() - started) * 1000)

    async def infer(self, card, model, inputs, names, row_error):
        """One BLS request to `model` -> {output: array}. row_error(row) -> (what, param) names a row of `text` in
        the client's terms; None: the model's messages already do (rerank: `query`, `documents[i]`)."""
        pb = self.pb_utils
        request = pb.InferenceRequest(
            model_name=model, requested_output_names=names,
            inputs=[pb.Tensor(name, array) for name, array in inputs.items()],
            # Outputs come back in host memory even when the encoder runs on a GPU (as_numpy needs that).
            preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU, 0))
        self.loop = loop = asyncio.get_running_loop()
        future, abort = loop.run_in_executor(self.executor, request.exec), loop.create_future()
        entry = (card.models, abort, future)
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
            bad_text = TEXT_ERROR.search(message)
            if bad_text and row_error:
                what, param = row_error(int(bad_text[1]))
                raise ApiError(400, f"{what} {bad_text[2]}", "invalid_input", param)
            bad_field = RERANK_ERROR.match(message)
            if bad_field and not row_error:
                raise ApiError(400, message, "invalid_input", bad_field[1].split("[")[0])
            if QUEUE_FULL in message.lower():  # a model's queue policy refused it: overload, not a fault
                raise ApiError(429, f"the server is busy: model '{model}' has a full queue (its max_queue_size); "
                                    f"retry", "overloaded", headers={"Retry-After": "1"})
            if any(marker in message.lower() for marker in NOT_AVAILABLE):
                raise ApiError(503, f"model '{card.id}' is not available: {message}", "model_not_ready",
                               headers={"Retry-After": "1"})
            raise ApiError(500, f"inference failed: {message}", "inference_failed")
        return {name: pb.get_output_tensor_by_name(response, name).as_numpy() for name in names}

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
        if not self.triton_started:  # a model call during Triton's start-up kills the calling stub
            raise ApiError(503, "tritonserver is still starting: try again in a few seconds", "starting",
                           headers={"Retry-After": "2"})
        return card

    @contextlib.contextmanager
    def changing(self, card):
        """While an admin action changes the card's models: their stubs exit (unload, or a reload of a step whose
        files changed), and the readiness thread must not fail their calls: an unload lets them finish."""
        self.changing_models |= set(card.models)
        try:
            yield
        finally:
            self.changing_models -= set(card.models)

    def load_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            missing = [m for m in card.models if not os.path.isfile(os.path.join(self.repository, m, "config.pbtxt"))]
            if missing:
                raise ApiError(422, f"model '{card.id}' cannot load: its export is incomplete, the model repository "
                                    f"has no {', '.join(missing)} (export it again)", "load_failed")
            self.unloaded_by_admin.discard(card.name)
            self.loaded_by_admin.add(card.name)
            with self.changing(card):
                try:
                    self.model_control("load", card.name)  # the ensemble brings its steps
                    for caller in (card.bls, card.rerank):  # BLS callers are no ensemble's steps: loaded on their own
                        self.model_control("load", caller)
                except Exception as error:  # noqa: BLE001 - Triton says why (missing file, bad config...)
                    self.loaded_by_admin.discard(card.name)
                    if not self.model_ready(card.name):  # (a failed reload leaves the old version serving)
                        # The steps that did load would stay loaded for nothing, stubs and memory included.
                        steps = [m for m in self.own_steps(card) if self.model_ready(m)]
                        for step in steps:
                            self.model_control("unload", step)
                        self.wait_unloaded(steps)
                    self.refresh_readiness()
                    raise ApiError(422, f"model '{card.id}' did not load: {error}", "load_failed") from None
            self.refresh_readiness()
            return time.monotonic() - started

    def unload_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            self.unloaded_by_admin.add(card.name)  # from now on new requests get 404
            self.loaded_by_admin.discard(card.name)
            with self.changing(card):
                try:
                    # Triton lets the requests in flight finish before the models go (each holds its models).
                    self.model_control("unload", card.name, unload_dependents=True)
                    # unload_dependents takes along only steps that were loaded as the ensemble's dependencies: a
                    # step loaded explicitly (--load-model=*, LOAD_MODELS naming it) stays, stub and memory
                    # included. Unload those too, unless another export's ensemble uses them.
                    steps = self.own_steps(card)
                    for step in steps:
                        self.model_control("unload", step)
                except Exception as error:  # noqa: BLE001
                    raise ApiError(500, f"model '{card.id}' did not unload: {error}", "unload_failed") from None
                self.wait_unloaded([card.name, *steps])
            self.refresh_readiness()
            return time.monotonic() - started

    def own_steps(self, card):
        shared = {m for c in self.cards_by_name.values() if c.name != card.name for m in c.models}
        return [m for m in (card.tokenizer, card.encoder, card.bls, card.rerank) if m not in shared]

    def delete_now(self, model_id):
        with self.admin_lock:
            card, started = self.admin_card(model_id), time.monotonic()
            if self.in_use(card.models):
                raise ApiError(409, f"model '{card.id}' is loaded: unload it first", "model_loaded")
            if card.name == "ensemble":
                raise ApiError(409, "the default export (tokenizer/embedding/ensemble) is part of the project's "
                                    "layout: re-export over it instead", "model_protected")
            folders = [os.path.join(self.repository, name) for name in card.models]
            folders = [folder for folder in folders if os.path.lexists(folder)]  # (a broken export may lack some)
            if not os.access(self.repository, os.W_OK) or not all(os.access(f, os.W_OK) for f in folders):
                raise ApiError(409, f"the model repository is read-only: cannot delete '{card.id}'",
                               "repository_read_only")
            for folder in folders:
                shutil.rmtree(folder)
            self.unloaded_by_admin.discard(card.name)
            self.startup.discard(card.name)  # an export under this name later waits for a load, as new ones do
            self.scan()
            return time.monotonic() - started
