"""The exports the proxy serves, one Card each (build/export.py writes <ensemble>/1/export.json), and which of their
models Triton has ready. The repository is scanned at start, when an unknown id is asked for (at most every
RESCAN_S), and around admin actions, so models exported after start-up are found."""
import glob
import json
import os
import time
from dataclasses import dataclass, replace
from typing import NamedTuple

from model_library import model_outputs
from model_library.model_errors import ErrorKind
from model_library.parity_report import parity_report

from .errors import NotFound, Unavailable

RESCAN_S = 2.0


class Health(NamedTuple):
    """The probes' answer (health: ready to serve; live: not to be restarted)."""
    ok: bool
    reason: str  # "ok", else why not


@dataclass(frozen=True)
class Card:
    """One export, as its export.json describes it (read_card): its models' names, what it serves and how; the
    routes and the service read it by attribute."""
    id: str
    name: str  # the ensemble
    tokenizer: str
    encoder: str
    bls: str  # the ensemble's BLS twin: many texts in length groups
    rerank: str | None  # None: a CLIP export (no rerank model)
    outputs: tuple[str, ...]
    embedding_size: int | None
    colbert_size: int | None
    max_length: int
    source: str
    created: int
    kind: str = "embedding"  # "cross-encoder": its rerank model scores pairs with the classifier; "clip": images too
    chunks: str | None = None  # the late chunking model (embedding exports)
    image: str | None = None  # CLIP exports: the image ensemble (encoded image bytes -> embedding) and its steps
    image_preprocess: str | None = None
    image_encoder: str | None = None
    architecture: str | None = None  # CLIP exports: open_clip's model name (ViT-B-32) or the HF model_type
    pretrained: str | None = None  # CLIP exports: open_clip's pretrained tag or checkpoint path
    # the prompts its tokenizer prepends (prompt_name / input_type), as export.json lists them, in its order (the
    # tokenizer's prompts.json's, which its errors list): ((name, text), ...)
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    pooling: str | None = None  # embedding exports: mean, cls, last... (TEI's /info)
    num_labels: int | None = None  # cross-encoder exports: the classifier's labels
    # more names clients may call it by (export --served-name, setting served_model_names); never another's id
    served_names: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # cross-encoder exports: the classifier's label names, in its order
    unnormalized: bool = False  # the encoder outputs embedding_unnormalized (exports since issue 49)
    # the width of each token vector (/embed_all): the model's hidden size, which a Dense module after pooling makes
    # differ from embedding_size; None: the same as embedding_size (exports before issue 56)
    hidden_size: int | None = None
    # the widths `dimensions` may ask for (export.json's, the BLS model's vectors.json); empty: not recorded
    dimensions: tuple[int, ...] = ()
    # inference-free SPLADE exports: the Router's tasks (query, document), which prompt_name may name and which the
    # tokenizer model answers (its query side a lookup the BLS model returns); empty: no Router
    routes: tuple[str, ...] = ()
    # the export's reference check (model_library/parity_report.py), as JSON text: /v1/models and TEI's /info show it
    parity_report: str = "{}"
    muvera_size: int | None = None  # MUVERA's encoding's width, exports with ColBERT outputs (None: not served)

    @property
    def models(self):
        return tuple(m for m in (self.name, self.tokenizer, self.encoder, self.bls, self.rerank, self.chunks,
                                 self.image, self.image_preprocess, self.image_encoder) if m)


def read_card(repository, name):
    """The Card of the export whose ensemble is `name`, or None (also for an export older than the BLS and rerank
    models: export it again)."""
    path = os.path.join(repository, name, "1", "export.json")
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        return Card(
            id=manifest["id"], name=manifest["name"], tokenizer=manifest["tokenizer_model"],
            encoder=manifest["encoder_model"], bls=manifest["bls_model"], rerank=manifest["rerank_model"],
            outputs=tuple(manifest["outputs"]), embedding_size=manifest.get("embedding_size"),
            colbert_size=manifest.get("colbert_size"), max_length=int(manifest["max_length"]),
            source=manifest["model"], created=int(os.path.getmtime(path)), kind=manifest.get("kind", "embedding"),
            chunks=manifest.get("chunks_model"), image=manifest.get("image_model"),
            image_preprocess=manifest.get("image_preprocess_model"), image_encoder=manifest.get("image_encoder_model"),
            architecture=manifest.get("architecture"), pretrained=manifest.get("pretrained"),
            prompts=tuple((manifest.get("prompts") or {}).items()),
            default_prompt_name=manifest.get("default_prompt_name"), pooling=manifest.get("pooling"),
            num_labels=manifest.get("num_labels"), served_names=tuple(manifest.get("served_names") or ()),
            labels=tuple(manifest.get("labels") or ()), unnormalized=bool(manifest.get("unnormalized_output")),
            hidden_size=manifest.get("hidden_size"), dimensions=tuple(manifest.get("dimensions") or ()),
            routes=tuple(manifest.get("routes") or ()), parity_report=json.dumps(parity_report(manifest)),
            muvera_size=(manifest.get(model_outputs.MUVERA) or {}).get("size"))
    except (OSError, ValueError, KeyError):
        return None


def served_names(setting):
    """The setting served_model_names, `name=export-id,name=export-id...` -> {export id: (names...)}."""
    names = {}
    for item in filter(None, (part.strip() for part in (setting or "").split(","))):
        name, _, model_id = item.partition("=")
        if not name.strip() or not model_id.strip():
            raise ValueError(f"served_model_names: {item!r} is not name=export-id")
        names.setdefault(model_id.strip(), []).append(name.strip())
    return {model_id: tuple(found) for model_id, found in names.items()}


class Registry:
    def __init__(self, repository, settings):
        self.repository, self.settings = repository, settings
        self.cards_by_name, self.scanned = {}, 0.0
        self.ready = {}  # Triton model name -> ready, kept by the readiness thread (no IPC on the request path)
        # explicit mode: what was meant to be loaded (LOAD_MODELS) and what the admin routes changed since
        self.startup = {name.strip() for name in settings.load_models.split(",")}
        self.loaded_by_admin, self.unloaded_by_admin = set(), set()
        self.failed = ""  # set by the readiness thread when BLS threads are stranded on dead stubs: not live
        self.draining = False
        self.setting_names = served_names(getattr(settings, "served_model_names", ""))
        self.scan()
        if "*" in self.startup:  # what the server loaded at start: the exports there now (later ones wait for a load)
            self.startup = set(self.cards_by_name)

    def scan(self):
        cards = {}
        for manifest in glob.glob(os.path.join(self.repository, "*", "1", "export.json")):
            card = read_card(self.repository, os.path.basename(os.path.dirname(os.path.dirname(manifest))))
            if card is not None:
                cards[card.name] = card
        taken = {name for card in cards.values() for name in (card.id, card.name)}
        for name, card in cards.items():  # a served name that is another export's id or name is never used
            names = (*card.served_names, *self.setting_names.get(card.id, ()))
            cards[name] = replace(card, served_names=tuple(dict.fromkeys(n for n in names if n not in taken)))
        self.cards_by_name, self.scanned = cards, time.monotonic()
        return cards

    def find(self, model_id):
        for _ in range(2):
            for card in self.cards_by_name.values():
                if model_id in (card.id, card.name):
                    return card
            for card in self.cards_by_name.values():
                if model_id in card.served_names:
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
                raise Unavailable("no model is served: export one (build/export.py)", ErrorKind.NO_MODEL_SERVED)
            served = ", ".join(sorted(c.id for c in self.cards())) or "none"
            raise NotFound(f"model '{model}' is not served here (served: {served})", ErrorKind.MODEL_NOT_FOUND, "model")
        if not self.is_ready(card):
            if not self.expected(card):
                raise NotFound(f"model '{card.id}' is not loaded (POST /v1/models/{card.id}/load)",
                               ErrorKind.MODEL_NOT_FOUND, "model")
            raise Unavailable(f"model '{card.id}' is not ready (loading)", ErrorKind.MODEL_NOT_READY, "model")
        return card

    def cards(self):
        return sorted((c for c in self.cards_by_name.values() if self.is_ready(c)), key=lambda c: c.id)

    def health(self):
        if self.draining:
            return Health(False, "shutting down")
        if self.failed:
            return Health(False, self.failed)
        card = self.default_card()
        if card is None:
            return Health(False, "no model is served")
        missing = [m for m in card.models if not self.ready.get(m)]
        if missing:
            return Health(False, f"model '{card.id}' is not ready: " +
                          "; ".join(f"{m} is not ready" for m in missing))
        return Health(True, "ok")

    def live(self):
        return Health(False, self.failed) if self.failed else Health(True, "ok")
