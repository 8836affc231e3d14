"""The two doors a bulk job goes through: KServe gRPC to the export's BLS model (`NAME_bls`: many texts per request,
cut into length groups by the server), or the HTTP front (`--http`: /v1/embeddings, /v1/encode) for users who only
reach the proxy. Both answer a request of texts with the same columns, and say what went wrong in three ways:

- Refused(index, kind, message): the server refuses that one text (empty, invalid UTF-8, too long...): it goes to the
  rejects file and the request is sent again without it;
- Retry(reason, after_s, kind): overloaded, unavailable, restarting, a timeout, or a fault (kind "internal", retried
  a few times): the same request again later;
- JobError: what no retry can change (a flag the export does not serve, a wrong key): the job stops, resumable.

Which is which comes from the error contract (model_library/model_errors.py: the kind and the field of a model's
error; the HTTP front's status, and the kind (`code`) and `field` its error body carries), never from reading prose.
"""
import base64
import http.client
import json
import os
import threading
import urllib.parse
from dataclasses import dataclass

import numpy as np

from model_library import model_errors, model_outputs  # the models' error contract, read by every caller; their outputs
from model_library.model_errors import ErrorKind

# output kind (--outputs) -> (the BLS model's tensors, the Parquet columns it fills): a column is named as the tensor
# it comes from (ColBERT's: as its kind), so the output vocabulary names both
QUANTIZED = tuple(model_outputs.QUANTIZED)
COUNTS = list(model_outputs.COUNTS)
KINDS = {
    "float": (model_outputs.TENSORS["dense"], model_outputs.TENSORS["dense"]),
    **{kind: (model_outputs.TENSORS[kind], model_outputs.TENSORS[kind]) for kind in QUANTIZED},
    "sparse": (model_outputs.TENSORS["sparse"], model_outputs.SPARSE[:2]),  # not sparse_count: the rows' lengths
    **{kind: (model_outputs.TENSORS[kind], (kind,)) for kind in ("colbert", *model_outputs.COLBERT_COMPACT)},
}
RETRY_KINDS = (ErrorKind.OVERLOADED, ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT, ErrorKind.CANCELLED)
REQUEST_TIMEOUT_S = 600.0  # one request of up to 256 long texts on a CPU: minutes at worst, never hours


class Refused(Exception):
    def __init__(self, index, kind, message):
        super().__init__(message)
        self.index, self.kind, self.message = index, kind, message


class Retry(Exception):
    """kind: the error's kind; "internal" (a fault of the server, not a busy or restarting one) is retried only a
    few times (job.INTERNAL_RETRIES)."""

    def __init__(self, reason, after_s=None, kind=None):
        super().__init__(reason)
        self.reason, self.after_s, self.kind = reason, after_s, kind


class JobError(Exception):
    pass


@dataclass
class Answer:
    columns: dict  # column -> one value per text (numpy arrays)
    truncated: np.ndarray  # bool per text
    tokens: int  # the request's tokens (for tokens/s)


@dataclass
class Limits:
    """What sizes the requests: from the server's own configs (KServe) or the proxy's /info (HTTP)."""
    max_texts: int  # texts per request
    max_request_bytes: int
    max_length: int  # tokens per text
    max_batch_tokens: int  # padded tokens per encoder run
    in_flight: int  # requests in flight that keep the encoder busy (job.py: why not more)


# ---------------------------------------------------------------- KServe gRPC
class KServeDoor:
    def __init__(self, url, model, kinds, parameters, max_length=None):
        import tritonclient.grpc as grpcclient

        self.grpc, self.url, self.model, self.kinds = grpcclient, url, model, kinds
        self.max_length = max_length  # the export's (export.json), when the tokenizer's config leaves it to the file
        self.parameters = {k: v for k, v in parameters.items() if v is not None}
        self.tensors = list(dict.fromkeys(t for kind in kinds for t in KINDS[kind][0])) + COUNTS
        self.local = threading.local()

    def client(self):
        if not hasattr(self.local, "client"):  # one channel per worker thread
            self.local.client = self.grpc.InferenceServerClient(self.url)
        return self.local.client

    def limits(self):
        """The BLS model's texts per request, the tokenizer's byte and token limits, the encoder's instances."""
        try:
            bls = self.config(self.model)
            parameters = {k: v.get("string_value", "") for k, v in bls.get("parameters", {}).items()}
            missing = [t for t in self.tensors if t not in {o["name"] for o in bls.get("output", ())}]
            if missing:
                served = ", ".join(o["name"] for o in bls.get("output", ()))
                raise JobError(f"{self.model} has no output {', '.join(missing)} (it serves {served}): ask for "
                               f"another --outputs, or --model another export")
            if "tokenizer_model" not in parameters or "encoder_model" not in parameters:
                raise JobError(f"{self.model} is not an export's BLS model (no tokenizer_model / encoder_model)")
            tokenizer = self.config(parameters["tokenizer_model"])
            encoder = self.config(parameters["encoder_model"])
        except Retry as error:  # not there, or no server: said once, before any work
            raise JobError(error.reason) from None
        settings = {k: v.get("string_value", "") for k, v in tokenizer.get("parameters", {}).items()}
        encoders = sum(int(group.get("count", 1)) for group in encoder.get("instance_group", ()) or [{}])
        return Limits(int(bls.get("max_batch_size") or 256), int(settings.get("max_request_bytes") or 4 << 20),
                      int(settings.get("max_length") or 0) or self.max_length,
                      int(settings.get("max_batch_tokens") or 16384),
                      max(encoders, 1))

    def config(self, name):
        try:
            return self.client().get_model_config(name, as_json=True)["config"]
        except self.grpc.InferenceServerException as error:
            raise Retry(f"model {name}: {error.message()}") from None

    def embed(self, texts):
        array = np.empty((len(texts), 1), dtype=object)
        array[:, 0] = texts
        text = self.grpc.InferInput("text", list(array.shape), "BYTES")
        text.set_data_from_numpy(array)
        outputs = [self.grpc.InferRequestedOutput(name) for name in self.tensors]
        try:
            result = self.client().infer(self.model, [text], outputs=outputs, parameters=self.parameters or None,
                                         client_timeout=REQUEST_TIMEOUT_S)
        except self.grpc.InferenceServerException as error:
            raise failure(error.message() or str(error)) from None
        tensors = {name: result.as_numpy(name) for name in self.tensors}
        columns = {}
        for kind in self.kinds:
            columns.update(rows_of(kind, tensors))
        return Answer(columns, tensors[model_outputs.TRUNCATED].reshape(-1).astype(bool),
                      int(tensors[model_outputs.NUM_TOKENS].sum()))


def failure(message):
    """A KServe error as Refused (one text), Retry or JobError, by the contract's kind and field."""
    info = model_errors.parse(message)
    if info.kind in model_errors.CLIENT_KINDS and info.field:
        name, index = model_errors.split_field(info.field)
        if name == "text" and index is not None:
            return Refused(index, info.kind, model_errors.problem(info))
    if info.kind in RETRY_KINDS or info.kind == ErrorKind.INTERNAL:  # internal: a stub restarting; retried a few times
        return Retry(f"{info.kind}: {info.message}", kind=info.kind)
    return JobError(info.message)


def rows_of(kind, tensors):
    """The columns of one output kind, one value per text, padding cut away."""
    names, columns = KINDS[kind]
    if kind == "sparse":
        counts = tensors[names[2]].reshape(-1)  # sparse_count
        return {column: [row[:n] for row, n in zip(tensors[name], counts)] for column, name in zip(columns, names)}
    if kind.startswith("colbert"):
        lengths = tensors[names[1]].reshape(-1)  # colbert_length
        return {columns[0]: [row[:n] for row, n in zip(tensors[names[0]], lengths)]}
    return {columns[0]: list(tensors[names[0]])}


# ---------------------------------------------------------------- the HTTP front
class HttpDoor:
    """/v1/embeddings (float as base64, or one quantized type per call) and /v1/encode (sparse, ColBERT); the key
    from API_KEY. Texts travel as JSON strings: a text that is not valid UTF-8 is refused here, as JSON cannot carry
    it (the KServe door sends it and the tokenizer refuses it)."""

    def __init__(self, url, model, kinds, parameters):
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        self.https, self.host, self.base = parts.scheme == "https", parts.netloc, parts.path.rstrip("/")
        self.model, self.kinds, self.parameters = model, kinds, {k: v for k, v in parameters.items() if v is not None}
        key = os.environ.get("API_KEY")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.local = threading.local()

    def connection(self):
        if not hasattr(self.local, "connection"):
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.local.connection = kind(self.host, timeout=REQUEST_TIMEOUT_S)
        return self.local.connection

    def request(self, method, path, body=None):
        try:
            connection = self.connection()
            connection.request(method, self.base + path, json.dumps(body) if body is not None else None, self.headers)
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as error:
            self.local.__dict__.pop("connection", None)
            raise Retry(f"{self.host}: {error}", kind=ErrorKind.UNAVAILABLE) from None
        if response.status == 200:
            return json.loads(payload)
        message, kind, field = error_body(payload)
        if response.status in (429, 503, 504):
            after = response.getheader("Retry-After")
            raise Retry(f"HTTP {response.status}: {message}", float(after) if after and after.isdigit() else None,
                        kind or ErrorKind.UNAVAILABLE)
        if response.status >= 500:  # a fault: retried a few times, as KServe's internal errors are
            raise Retry(f"internal: HTTP {response.status}: {message}", kind=ErrorKind.INTERNAL)
        name, index = model_errors.split_field(field or "")
        if name == "input" and index is not None and kind in model_errors.CLIENT_KINDS:
            problem = message[len(field):].lstrip() if message.startswith(field) else message
            raise Refused(index, kind, problem)
        raise JobError(f"HTTP {response.status} from {path}: {message}")

    def limits(self):
        try:
            info = self.request("GET", "/info" + (f"?model={urllib.parse.quote(self.model)}" if self.model else ""))
        except Retry as error:
            raise JobError(f"GET /info: {error.reason}") from None
        return Limits(min(256, int(info.get("max_client_batch_size") or 256)), 2 << 20,
                      int(info.get("max_input_length") or 512), 16384, 4)

    def embed(self, texts):
        try:
            inputs = [t.decode("utf-8") for t in texts]
        except UnicodeDecodeError:
            index = next(i for i, t in enumerate(texts) if not valid_utf8(t))
            raise Refused(index, ErrorKind.INVALID_INPUT,
                          "is not valid UTF-8 (JSON cannot carry it to the HTTP front)") from None
        base = {"input": inputs, **({"model": self.model} if self.model else {}),
                **{k: v for k, v in self.parameters.items()
                   if k in ("dimensions", "prompt_name", "input_type", "truncate")}}
        columns, truncated, tokens = {}, np.zeros(len(texts), dtype=bool), 0
        for kind in [k for k in self.kinds if k == "float" or k in QUANTIZED]:
            encoding = "base64" if kind == "float" else kind
            answer = self.request("POST", "/v1/embeddings", {**base, "encoding_format": encoding})
            data = sorted(answer["data"], key=lambda item: item["index"])
            dtype = np.int8 if kind in ("int8", "binary") else np.uint8
            columns[KINDS[kind][1][0]] = [np.frombuffer(base64.b64decode(item["embedding"]), "<f4")
                                          if kind == "float" else np.asarray(item["embedding"], dtype=dtype)
                                          for item in data]
            truncated |= np.array([bool(item.get("truncated")) for item in data])
            tokens = int(answer.get("usage", {}).get("total_tokens", 0))
        rest = [k for k in self.kinds if k == "sparse" or k.startswith("colbert")]
        if rest:
            colbert = next((k for k in rest if k.startswith("colbert")), None)
            body = {"input": inputs, **({"model": self.model} if self.model else {}), "return_dense": False,
                    "return_sparse": "sparse" in rest, "return_colbert": colbert is not None,
                    **({"colbert_type": colbert.partition("_")[2] or "float"} if colbert else {}),
                    **{k: v for k, v in self.parameters.items() if k in ("colbert_pool_factor", "truncate")}}
            answer = self.request("POST", "/v1/encode", body)
            data = sorted(answer["data"], key=lambda item: item["index"])
            if "sparse" in rest:
                indices, values = KINDS["sparse"][1]
                columns[indices] = [np.asarray(d["sparse"]["indices"], dtype=np.int64) for d in data]
                columns[values] = [np.asarray(d["sparse"]["values"], dtype=np.float32) for d in data]
            if colbert:
                dtype = {"colbert": np.float32, "colbert_fp16": np.float16, "colbert_int8": np.int8,
                         "colbert_binary": np.uint8}[colbert]
                columns[KINDS[colbert][1][0]] = [np.asarray(d["colbert"], dtype=dtype) for d in data]
            truncated |= np.array([bool(item.get("truncated")) for item in data])
            tokens = tokens or int(answer.get("usage", {}).get("total_tokens", 0))
        return Answer(columns, truncated, tokens)


def error_body(payload):
    """An HTTP front error's (message, kind, field): OpenAI's shape {"error": {message, code, field}} (Cohere's has
    it too) or TEI's {error, code, field} (GET /info); (the start of the body, None, None) for any other answer."""
    try:
        body = json.loads(payload)
        error = body["error"]
        if isinstance(error, str):
            return error, body.get("code"), body.get("field")
        return error.get("message", ""), error.get("code"), error.get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        return payload[:300].decode("utf-8", "replace"), None, None


def valid_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
