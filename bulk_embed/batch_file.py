"""OpenAI's batch files (issue 70): `make embed INPUT=requests.jsonl OUTPUT=answers.jsonl`, the format of OpenAI's
Batch API and `vllm run-batch`. Each input line is a request, `{"custom_id", "method": "POST", "url", "body"}`, for
/v1/embeddings or /v1/rerank; each is sent to the HTTP front as it is (the server decides every answer, as for any
client), and answered by one output line per custom_id, OpenAI's batch output:

    {"id": "batch_req_<line>", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}

A request the server refuses keeps its answer (status_code 400 and the error body), as OpenAI writes it; a line
that is no request (not JSON, no custom_id, another method or url) gets `"response": null` and an `error` object
(OpenAI's BatchError: code, message, line). Nothing is dropped: the output holds a line for every input line, in
input order. A custom_id used twice refuses the file before any request, as OpenAI's validation does.

Resumable and locked like the Parquet path: one writer per output (lock.py); each answer is appended to
OUTPUT.partial as it arrives, so a job killed (kill -9 included) and started again with the same arguments sends
only the lines not answered yet; overload (429), a restart (503) or a timeout (504) is waited out, with the server's
Retry-After, up to --max-wait per line, after which the job stops, resumable."""
import concurrent.futures
import hashlib
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass

from bulk_embed import lock

URLS = ("/v1/embeddings", "/v1/rerank")
RETRY_STATUSES = (429, 503, 504)
INTERNAL_RETRIES = 3  # a 500 again and again is the answer: it is written, not retried for ever
REQUEST_TIMEOUT_S = 600.0
PEEK_BYTES = 1 << 20


@dataclass
class Line:
    number: int  # 1-based, as an editor shows it
    custom_id: str | None
    url: str | None = None
    body: dict | None = None
    problem: str | None = None


def is_batch_file(path):
    """Whether the first non-blank line of the .jsonl at `path` is a batch request (custom_id, and url or body)."""
    try:
        with open(path, "rb") as handle:
            for raw in handle:
                if raw.strip():
                    first = json.loads(raw[:PEEK_BYTES])
                    return isinstance(first, dict) and "custom_id" in first and ("body" in first or "url" in first)
    except (OSError, ValueError):
        return False
    return False


def read_lines(path, default_model=None):
    """Every non-blank line of the batch file, checked: a Line with its request, or its problem."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                request = json.loads(raw)
            except ValueError as error:
                yield Line(number, None, problem=f"line {number} is not JSON ({error})")
                continue
            if not isinstance(request, dict):
                yield Line(number, None, problem=f"line {number} is not a JSON object")
                continue
            custom_id = request.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                yield Line(number, None, problem=f"line {number}: custom_id must be a non-empty string")
                continue
            method, url, body = request.get("method", "POST"), request.get("url"), request.get("body")
            problem = (f"method {method!r}: batch requests are POST" if method != "POST" else
                       f"url {url!r}: this server's batch requests go to {' or '.join(URLS)}" if url not in URLS else
                       "body must be a JSON object (the request's body)" if not isinstance(body, dict) else None)
            if problem:
                yield Line(number, custom_id, problem=f"line {number}: {problem}")
                continue
            if default_model and "model" not in body:  # --model: the export of the lines that name none
                body = {**body, "model": default_model}
            yield Line(number, custom_id, url, body)


def check_unique(lines):
    """OpenAI's rule: each custom_id once. The first repeat refuses the file, naming both lines."""
    seen = {}
    for line in lines:
        if line.custom_id is None:
            continue
        if line.custom_id in seen:
            raise SystemExit(f"embed: custom_id {line.custom_id!r} on line {line.number} repeats line "
                             f"{seen[line.custom_id]}: a batch file names each request once")
        seen[line.custom_id] = line.number


def invalid_line(line):
    return {"id": f"batch_req_{line.number}", "custom_id": line.custom_id, "response": None,
            "error": {"code": "invalid_request", "message": line.problem, "line": line.number, "param": None}}


class Stopped(Exception):
    pass


class Front:
    """The HTTP front, one connection per thread; the key from API_KEY."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        self.https, self.host, self.base = parts.scheme == "https", parts.netloc, parts.path.rstrip("/")
        key = os.environ.get("API_KEY")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.local = threading.local()

    def post(self, path, body):
        """(status, request id, body bytes), or OSError / HTTPException when the server cannot be reached."""
        if not hasattr(self.local, "connection"):
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.local.connection = kind(self.host, timeout=REQUEST_TIMEOUT_S)
        try:
            self.local.connection.request("POST", self.base + path, json.dumps(body), self.headers)
            response = self.local.connection.getresponse()
            return response.status, response.getheader("x-request-id"), response.getheader("Retry-After"), \
                response.read()
        except (OSError, http.client.HTTPException):
            self.local.__dict__.pop("connection", None)
            raise

    def answer(self, line, max_wait_s):
        """The output line of one request: its answer once it is not overload, a restart or a timeout; Stopped when
        the server did not give one within max_wait_s."""
        started, delay, internal = time.monotonic(), 0.5, 0
        while True:
            try:
                status, request_id, retry_after, payload = self.post(line.url, line.body)
                reason = f"HTTP {status}"
            except (OSError, http.client.HTTPException) as error:
                status, retry_after, reason = None, None, f"{self.host}: {error}"
            if status == 500 and internal < INTERNAL_RETRIES:
                internal += 1
            elif status is not None and status not in RETRY_STATUSES:
                break
            wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
            if time.monotonic() - started + wait > max_wait_s:
                raise Stopped(f"line {line.number} ({line.custom_id!r}): {reason} for {max_wait_s:.0f} s")
            time.sleep(wait)
            delay = min(delay * 2, 30.0)
        try:
            body = json.loads(payload)
        except ValueError:
            body = {"error": {"message": payload.decode("utf-8", "replace")[:1000]}}
        return {"id": f"batch_req_{line.number}", "custom_id": line.custom_id,
                # the server's x-request-id where it sends one; else an id of this request's own, as the format has one
                "response": {"status_code": status, "request_id": request_id or f"req_{uuid.uuid4().hex}",
                             "body": body}, "error": None}


class Answers:
    """OUTPUT.partial: the output lines written so far, appended as they come (any order); read back on a resume,
    a line torn by a kill cut off. OUTPUT.partial.json names the job it belongs to."""

    def __init__(self, output, settings, restart):
        self.path, self.settings_path = output + ".partial", output + ".partial.json"
        self.lock = threading.Lock()
        if restart or self._settings() != settings:
            if not restart and os.path.exists(self.path):
                print(f"embed: {self.path} belongs to another job (other input or server): starting over",
                      file=sys.stderr)
            for path in (self.path, self.settings_path):
                if os.path.exists(path):
                    os.remove(path)
            with open(self.settings_path, "w", encoding="utf-8") as handle:
                json.dump(settings, handle)
        self.done = self._read()
        self.handle = open(self.path, "ab")  # noqa: SIM115 - held for the job's life, closed by close()

    def _settings(self):
        try:
            with open(self.settings_path, encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def _read(self):
        done, good = {}, 0
        if not os.path.exists(self.path):
            return done
        with open(self.path, "rb") as handle:
            for raw in handle:
                try:
                    answer = json.loads(raw) if raw.endswith(b"\n") else None
                except ValueError:
                    answer = None
                if answer is None:
                    break
                done[answer["id"]] = answer
                good += len(raw)
        with open(self.path, "r+b") as handle:  # a line torn by a kill: cut off, its request is sent again
            handle.truncate(good)
        return done

    def add(self, answer):
        with self.lock:
            self.handle.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
            self.handle.flush()
            self.done[answer["id"]] = answer

    def close(self):
        self.handle.close()


def run(args):
    """The batch job `args` (python -m bulk_embed's) asks for."""
    if not args.output.endswith(".jsonl"):
        raise SystemExit(f"embed: {args.input} is a batch file (OpenAI's format): its answers go to a .jsonl "
                         f"output, not {args.output}")
    url = args.http or f"http://127.0.0.1:{os.environ.get('PROXY_PORT', '8080')}"
    lines = list(read_lines(args.input, args.model))
    check_unique(lines)
    output = os.path.abspath(args.output)
    writer = lock.OutputLock(output).acquire()
    with open(args.input, "rb") as handle:  # a resume goes on only with the same requests, to the same server
        settings = {"input": os.path.abspath(args.input), "sha256": hashlib.sha256(handle.read()).hexdigest(),
                    "url": url}
    answers = Answers(output, settings, args.restart)
    resumed = len(answers.done)
    for line in lines:
        if line.problem and f"batch_req_{line.number}" not in answers.done:
            answers.add(invalid_line(line))
    todo = [line for line in lines if f"batch_req_{line.number}" not in answers.done]
    front, started = Front(url), time.monotonic()
    print(f"embed: batch file {args.input} -> {args.output} through HTTP {url}: {len(lines)} requests"
          f"{f', {resumed} answered before' if resumed else ''}, {len(todo)} to send, {args.in_flight or 4} in "
          f"flight", file=sys.stderr, flush=True)
    pool = concurrent.futures.ThreadPoolExecutor(args.in_flight or 4)
    try:
        futures = [pool.submit(front.answer, line, args.max_wait) for line in todo]
        for future in concurrent.futures.as_completed(futures):
            answers.add(future.result())
    except Stopped as error:
        pool.shutdown(wait=True, cancel_futures=True)  # the requests still running are sent again on a resume
        raise SystemExit(f"embed: stopped: {error}. The answers so far are kept in {answers.path}: the same command "
                         f"goes on from there") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        answers.close()
    by_line = sorted(answers.done.values(), key=lambda a: int(a["id"].rsplit("_", 1)[1]))
    if len(by_line) != len(lines):
        raise SystemExit(f"embed: the answers do not account for the batch: {len(by_line)} for {len(lines)} lines")
    temporary = output + ".writing"
    with open(temporary, "wb") as handle:
        for answer in by_line:
            handle.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, output)
    for path in (answers.path, answers.settings_path):
        os.remove(path)
    writer.release()
    statuses = {}
    for answer in by_line:
        key = "invalid" if answer["response"] is None else str(answer["response"]["status_code"])
        statuses[key] = statuses.get(key, 0) + 1
    seconds = time.monotonic() - started
    print(f"embed: done: {len(by_line)} answers in {args.output} (one per request, in input order; "
          f"{', '.join(f'{n} {k}' for k, n in sorted(statuses.items()))}); {len(todo)} sent this run in "
          f"{seconds:.1f} s", file=sys.stderr, flush=True)
    return 0
