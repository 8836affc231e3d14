"""What the routes call (app.ServiceProtocol), over BLS and Triton's HTTP API, in parts sharing one state: busy.py's
BusyPath (what a request the gate refused still gets: the busy path, once), inference.py (each export's models
through BLS, the models' errors as the error table's kinds), model_control.py (load and unload through Triton's
repository API), readiness.py's ModelReadiness (which models are ready, kept off the request path). Its answers are
inference.py's dataclasses (Embeddings, ImageEmbeddings, RerankScores, Prediction, ChunkEmbeddings, ChunkedDocuments,
Measured, Token),
re-exported here for the routes' fakes. Errors are errors.py's kinds; pb_utils is handed in (tests import this
file)."""
import threading
import time

from .busy import BusyPath
from .errors import ClientError, Timeout, Unavailable
from .inference import (
    ChunkedDocuments,
    ChunkEmbeddings,
    DocumentChunks,
    Embeddings,
    ImageEmbeddings,
    Inference,
    Measured,
    Prediction,
    RerankScores,
    SparseWeights,
    TextChunks,
    Token,
    admit_request,
    step_error,
)
from .model_control import ModelControl
from .readiness import ModelReadiness
from .registry import Health

__all__ = ["Service", "BusyPath", "Embeddings", "ImageEmbeddings", "ChunkEmbeddings", "TextChunks", "ChunkedDocuments",
           "DocumentChunks", "Measured",
           "Prediction", "RerankScores", "SparseWeights", "Token", "admit_request", "step_error", "ClientError",
           "Timeout", "Unavailable", "Health"]


class Service(BusyPath, Inference, ModelControl, ModelReadiness):
    def __init__(self, pb_utils, registry, triton, settings, executor):
        self.pb, self.registry, self.triton, self.settings, self.executor = \
            pb_utils, registry, triton, settings, executor
        self.bls_rows = {}  # BLS / image model -> its max_batch_size (Triton's config of it), kept while it is ready
        self.max_documents = {}  # rerank model -> its parameter max_documents (Triton's config), kept while it is ready
        self.measuring = 0  # BLS calls of measure() in flight (questions to the tokenizer outside admission)
        self.inflight = set()  # (models, the future its request awaits, BLS call) of each call in flight
        self.calls_started = {}  # BLS call -> when it was sent, until it returns (whether or not anyone still waits)
        self.loop = None  # the HTTP server's event loop, known from the first call
        self.admin_lock = threading.Lock()
        self.triton_started = False  # set by the readiness thread once Triton's start-up is over
        self.changing_models = set()  # models an admin action is changing now: their readiness loss is no fault

    # ---------------------------------------------------------------- the registry's answers
    draining = property(lambda self: self.registry.draining)

    def cards(self):
        return self.registry.cards()

    def resolve(self, model):
        return self.registry.resolve(model)

    def exports(self):
        """Every export in the model repository, loaded or not (scanned again), by id."""
        return sorted(self.registry.scan().values(), key=lambda c: c.id)

    def health(self):
        """The registry's answer, or busy: a model call still running past request_timeout_s means one long
        execution holds the models (issue 72: an 8,000-token text on 2 cores holds the rate limiter every model
        shares), so new work would only wait; /health says so (503) while /health/live stays 200."""
        health = self.registry.health()
        started = min(list(self.calls_started.values()), default=None)  # (a copy: BLS threads remove theirs)
        running_s = 0.0 if started is None else time.monotonic() - started
        if health.ok and running_s > self.settings.request_timeout_s:
            return Health(False, f"busy: a model call has run for {running_s:.0f} s, past request_timeout_s "
                                 f"({self.settings.request_timeout_s:g} s); new requests would wait for it")
        return health

    def live(self):
        return self.registry.live()
