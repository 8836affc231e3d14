"""Load test: N clients on mixed routes for a fixed time, at several N; does the service degrade by refusing?

Each client is a closed loop (its next request when the last is answered) over five routes in turn:
  proxy_queries   POST /v1/embeddings, 8 queries          kserve_query    gRPC `ensemble`, 1 query
  proxy_passages  POST /v1/embeddings, 4 passages         kserve_batch    gRPC `ensemble_bls`, 8 queries
  proxy_rerank    POST /v1/rerank, 1 query + 8 passages
and two heavy routes that --routes may add (issue 69), each of --heavy-texts passages (48):
  proxy_similarity    TEI's POST /similarity, a query against the passages (cosine of dense vectors)
  proxy_rerank_large  POST /v1/rerank, 1 query + the passages
--routes lists the routes a client takes in turn (a route named twice is taken twice as often), or names a mix:
heavy-share (the HTTP front: 8 turns, of them 1 /similarity and 1 large rerank).
A refused request (HTTP 429/503, gRPC UNAVAILABLE / RESOURCE_EXHAUSTED) is counted with the time it took to be
refused, and its client waits the answer's Retry-After (1 s without one: gRPC) as a well-behaved client does
(the OpenAI SDK's retries wait it); another 4xx (a request declined up front, e.g. too big for the deadline) is
counted by status and error code, and its client waits 1 s too. Every vector
is compared with the one the same text got on a quiet server before the run (cosine >= 0.9999; rerank and
/similarity: scores within 1e-4 of the reference vectors' dot products): anything else counts as misrouted. RSS
(tritonserver and its stubs) and the /dev/shm regions they map are sampled every 5 s.

Measuring on a machine that is not quiet (issue 69): --background-load runs each level beside busy processes on the
same cores (bench/background_load.py: one per core at nice 10, --background-procs / --background-nice), and the
report says what they got; --corpus mixed-lengths is a corpus the admission gate was not tuned on; --client openai
sends the /v1/embeddings requests through the OpenAI SDK's AsyncOpenAI (its own httpx connection pool) instead of
the aiohttp loop.

Targets (issue 16), at the highest N against the lowest: goodput (texts/s of answered requests) >= 90 %; no 504
and no client timeout; refusals answered within 100 ms (p99); p99 of answered requests <= 3x; 0 misrouted; RSS and
/dev/shm flat.

    python -m bench.overload [--clients 8,50,200] [--seconds 300] [--corpus multilingual|english|mixed-lengths]
                             [--routes ...|heavy-share] [--client aiohttp|openai] [--background-load] [--repository DIR]
    python -m bench.overload --clients 2,6 --seconds 2 --queries 100 --passages 50 --short   # a smoke
"""
import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bench import background_load, common
from bench import corpus as corpus_lib
from bench.experiment import scratch_export
from model_library.triton_server import process_table, secret

ROUTES = ("proxy_queries", "proxy_passages", "proxy_rerank", "kserve_query", "kserve_batch")  # the default mix
HEAVY_ROUTES = ("proxy_similarity", "proxy_rerank_large")
MIXES = {"heavy-share": ("proxy_queries", "proxy_passages", "proxy_queries", "proxy_rerank", "proxy_queries",
                         "proxy_similarity", "proxy_passages", "proxy_rerank_large")}
CORPORA = ("multilingual", "english", "mixed-lengths")
CLIENTS = ("aiohttp", "openai")
REFUSED_HTTP = {429, 503}
REFUSED_GRPC = ("StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED")
CLIENT_TIMEOUT_S = 120  # past the proxy's request_timeout_s (60): its 504 shows, not the client's own give-up


def progress(message):
    print(f"[overload {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the server's footprint
def server_tree(pid):
    """tritonserver's pid and those of every process under it (the Python stubs)."""
    children = {}
    for child, info in process_table(argv=False).items():
        children.setdefault(info.ppid, []).append(child)
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def footprint_mb(pid):
    """(RSS of the server's processes, size of the /dev/shm files they map), in MB: this server's own, not the
    machine's (other servers may share /dev/shm)."""
    rss, regions = 0, set()
    for process in server_tree(pid):
        try:
            with open(f"/proc/{process}/status") as handle:
                rss += next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
            with open(f"/proc/{process}/maps") as handle:
                regions.update(line.split(None, 5)[5].strip() for line in handle if "/dev/shm/" in line)
        except (OSError, StopIteration, IndexError):
            pass
    shm = 0
    for region in regions:
        try:
            shm += os.stat(region.replace(" (deleted)", "")).st_size
        except OSError:
            pass
    return rss / 1024, shm / 2**20


def retry_after_s(headers):
    """Seconds of an answer's Retry-After (delay-seconds form), 1 when it has none or another form."""
    try:
        return max(0.0, float(headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


# ---------------------------------------------------------------- one run
class Level:
    """What N clients saw over one run."""

    def __init__(self, clients, routes=ROUTES):
        self.clients = clients
        self.answered = {route: [] for route in routes}  # latencies (s)
        self.refused = {route: [] for route in routes}  # time to be refused (s)
        self.timeouts, self.errors = 0, {}
        self.declined = {}  # "route HTTP status code": a 4xx other than 429, a request declined up front
        self.texts = 0
        self.misrouted = 0
        self.samples = []  # (rss MB, shm MB)

    def error(self, what):
        self.errors[what] = self.errors.get(what, 0) + 1

    def decline(self, route, status, content):
        code, _ = common.error_of(content)
        what = f"{route} HTTP {status} {code}".strip()
        self.declined[what] = self.declined.get(what, 0) + 1

    def row(self, seconds):
        answered = [x for values in self.answered.values() for x in values]
        refused = [x for values in self.refused.values() for x in values]

        def p(values, q):
            return float(np.percentile(values, q)) * 1000 if values else float("nan")
        rss, shm = zip(*self.samples) if self.samples else ((0,), (0,))
        return {"clients": self.clients, "seconds": seconds, "goodput_texts_s": self.texts / seconds,
                "answered": len(answered), "answered_p50_ms": p(answered, 50), "answered_p99_ms": p(answered, 99),
                "per_route_p99_ms": {r: p(v, 99) for r, v in self.answered.items()},
                "refused": len(refused), "refused_p95_ms": p(refused, 95), "refused_p99_ms": p(refused, 99),
                "per_route_refused": {r: [len(v), p(v, 99)] for r, v in self.refused.items()},
                "timeouts_504": self.timeouts, "errors": self.errors, "declined": self.declined,
                "misrouted": self.misrouted,
                "rss_mb": [rss[0], max(rss), rss[-1]], "shm_mb": [shm[0], max(shm), shm[-1]]}


class Workload:
    def __init__(self, queries, passages, reference, model, proxy_url, grpc_url, admin_key, routes=ROUTES,
                 heavy_texts=48, client="aiohttp"):
        self.retry_after = {}  # a client task's last Retry-After (seconds)
        self.queries, self.passages, self.reference, self.routes = queries, passages, reference, routes
        self.model, self.proxy_url, self.grpc_url = model, proxy_url, grpc_url
        self.heavy_texts, self.client, self.admin_key = heavy_texts, client, admin_key
        self.headers = {"content-type": "application/json"}
        if admin_key:
            self.headers["authorization"] = f"Bearer {admin_key}"

    def check(self, texts, vectors, level):
        for text, vector in zip(texts, vectors):
            if float(np.dot(self.reference[text], np.asarray(vector, dtype=np.float32))) < 0.9999:
                level.misrouted += 1

    async def proxy(self, session, path, body):
        async with session.post(self.proxy_url + path, data=json.dumps(body), headers=self.headers) as response:
            self.retry_after[id(asyncio.current_task())] = retry_after_s(response.headers)
            return response.status, await response.read()

    async def embed(self, session, sdk, texts):
        """POST /v1/embeddings: (status, the body) through aiohttp, or (200, the vectors) through the OpenAI SDK
        (its default request: base64 vectors, decoded by the SDK), (status, the body) when it raises the answer's
        status."""
        if sdk is None:
            return await self.proxy(session, "/v1/embeddings", {"model": self.model, "input": texts})
        import openai
        try:
            answer = await sdk.embeddings.create(model=self.model, input=texts)
        except openai.APITimeoutError:
            raise asyncio.TimeoutError() from None
        except openai.APIStatusError as error:
            self.retry_after[id(asyncio.current_task())] = retry_after_s(error.response.headers)
            return error.status_code, error.response.content
        except openai.APIConnectionError as error:
            raise aiohttp.ClientError(f"OpenAI SDK: {error}") from None
        return 200, [item.embedding for item in sorted(answer.data, key=lambda d: d.index)]

    def check_scores(self, query, documents, scores, level):
        """Each score (in the documents' order) against the dot product of the reference vectors."""
        for document, score in zip(documents, scores):
            expected = float(np.dot(self.reference[query], self.reference[document]))
            level.misrouted += score is None or abs(score - expected) > 1e-4
        level.misrouted += len(scores) != len(documents)

    async def one(self, route, i, session, grpc, level, sdk=None):
        """One request; returns what its client should do next: 'go' or 'back off'."""
        started = time.monotonic()

        def pick(pool, n):  # the request's texts: client and turn choose them, so every text recurs
            return [pool[(i * n + k) % len(pool)] for k in range(n)]
        try:
            if route.startswith("proxy"):
                if route in ("proxy_rerank", "proxy_rerank_large"):
                    query = pick(self.queries, 1)[0]
                    documents = pick(self.passages, 8 if route == "proxy_rerank" else self.heavy_texts)
                    status, content = await self.proxy(session, "/v1/rerank", {
                        "model": self.model, "query": query, "documents": documents, "return_documents": False})
                elif route == "proxy_similarity":  # TEI's: the cosine of dense vectors (the rerank model's)
                    query, documents = pick(self.queries, 1)[0], pick(self.passages, self.heavy_texts)
                    status, content = await self.proxy(session, "/similarity", {
                        "model": self.model, "inputs": {"source_sentence": query, "sentences": documents}})
                else:
                    texts = pick(self.queries, 8) if route == "proxy_queries" else pick(self.passages, 4)
                    status, content = await self.embed(session, sdk, texts)
                elapsed = time.monotonic() - started
                if status in REFUSED_HTTP:
                    level.refused[route].append(elapsed)
                    return "back off"
                if status == 504:
                    level.timeouts += 1
                    return "go"
                if 400 <= status < 500:  # declined up front: never sent again at once
                    level.decline(route, status, content)
                    return "back off"
                if status != 200:
                    level.error(f"HTTP {status}")
                    return "go"
                answer = json.loads(content) if isinstance(content, bytes) else content
                if route in ("proxy_rerank", "proxy_rerank_large"):
                    scores = [None] * len(documents)
                    for result in answer["results"]:
                        scores[result["index"]] = result["relevance_score"]
                    self.check_scores(query, documents, scores, level)
                    level.texts += len(documents)
                elif route == "proxy_similarity":
                    self.check_scores(query, documents, answer, level)
                    level.texts += len(documents)
                else:
                    vectors = answer if isinstance(answer, list) else [
                        item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
                    self.check(texts, vectors, level)
                    level.texts += len(texts)
            else:
                texts = pick(self.queries, 1 if route == "kserve_query" else 8)
                text = grpcaio.InferInput("text", [len(texts), 1], "BYTES")
                text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1))
                result = await grpc.infer("ensemble" if route == "kserve_query" else "ensemble_bls", [text],
                                          outputs=[grpcaio.InferRequestedOutput("embedding")],
                                          client_timeout=CLIENT_TIMEOUT_S)
                elapsed = time.monotonic() - started
                self.check(texts, result.as_numpy("embedding"), level)
                level.texts += len(texts)
            level.answered[route].append(elapsed)
            return "go"
        except InferenceServerException as error:
            status = str(error.status())
            if status in REFUSED_GRPC or "Exceeds maximum queue size" in str(error):
                level.refused[route].append(time.monotonic() - started)
                return "back off"
            level.error(f"gRPC {status}" if "DEADLINE" not in status else "client timeout")
            return "go"
        except asyncio.TimeoutError:
            level.error("client timeout")
            return "go"
        except aiohttp.ClientError as error:
            level.error(f"HTTP {type(error).__name__}")
            return "go"

    def openai_sdk(self):
        """The OpenAI SDK's async client on the proxy (its own defaults: an httpx pool of 1,000 connections, 100
        kept alive), no retries of its own: a refusal is this loop's to count and wait out."""
        import openai
        return openai.AsyncOpenAI(base_url=self.proxy_url + "/v1", api_key=self.admin_key or "unused",
                                  max_retries=0, timeout=CLIENT_TIMEOUT_S)

    async def run(self, clients, seconds, server_pid):
        level = Level(clients, self.routes)
        end = time.monotonic() + seconds
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=0)  # one connection per client, as N separate clients have
        sdk = self.openai_sdk() if self.client == "openai" else None
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            grpc = grpcaio.InferenceServerClient(self.grpc_url)

            async def client(c):
                n = c
                while time.monotonic() < end:
                    route = self.routes[n % len(self.routes)]
                    if await self.one(route, n, session, grpc, level, sdk) == "back off":
                        # the answer's Retry-After, as a well-behaved client (the OpenAI SDK's retries) waits it
                        wait = self.retry_after.pop(id(asyncio.current_task()), 1.0)
                        await asyncio.sleep(min(wait, max(0.0, end - time.monotonic())))  # not past the level
                    n += clients

            async def sample():
                while time.monotonic() < end:
                    level.samples.append(footprint_mb(server_pid))
                    await asyncio.sleep(5)
                level.samples.append(footprint_mb(server_pid))

            await asyncio.gather(sample(), *(client(c) for c in range(clients)))
            await grpc.close()
        if sdk is not None:
            await sdk.close()
        return level.row(seconds)


# ---------------------------------------------------------------- before the run: the texts and their vectors
async def reference_vectors(grpc_url, texts):
    grpc = grpcaio.InferenceServerClient(grpc_url)
    vectors = {}
    for start in range(0, len(texts), 32):
        chunk = texts[start:start + 32]
        text = grpcaio.InferInput("text", [len(chunk), 1], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in chunk], dtype=object).reshape(-1, 1))
        result = await grpc.infer("ensemble_bls", [text], outputs=[grpcaio.InferRequestedOutput("embedding")])
        vectors.update(zip(chunk, result.as_numpy("embedding")))
    await grpc.close()
    return vectors


def markdown(rows):
    base = rows[0]
    lines = ["| clients | goodput texts/s | × lowest N | answered | p50 ms | p99 ms | p99 × lowest N | refused | "
             "refusal p95 / p99 ms | 504 / timeouts | other errors | misrouted | RSS MB start→max→end | /dev/shm MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        goodput, p99 = row["goodput_texts_s"], row["answered_p99_ms"]
        lines.append(
            f"| {row['clients']} | {goodput:.1f} | {goodput / base['goodput_texts_s']:.2f} "
            f"| {row['answered']} | {row['answered_p50_ms']:.0f} | {p99:.0f} | "
            f"{p99 / base['answered_p99_ms']:.2f} | {row['refused']} | {row['refused_p95_ms']:.1f} / "
            f"{row['refused_p99_ms']:.1f} | "
            f"{row['timeouts_504'] + row['errors'].get('client timeout', 0)} | "
            f"{sum(v for k, v in row['errors'].items() if k != 'client timeout')} | {row['misrouted']} | "
            f"{row['rss_mb'][0]:.0f}→{row['rss_mb'][1]:.0f}→{row['rss_mb'][2]:.0f} | "
            f"{row['shm_mb'][0]:.0f}→{row['shm_mb'][1]:.0f}→{row['shm_mb'][2]:.0f} |")
    return "\n".join(lines)


def client_line(client):
    """What sent the requests, for the report."""
    if client == "openai":
        import openai
        return (f"/v1/embeddings through the OpenAI SDK's AsyncOpenAI (openai {openai.__version__}: its own "
                f"connection pool, default request with base64 vectors, max_retries 0); the other HTTP routes and "
                f"gRPC from this script's aiohttp and tritonclient loop")
    return "every request from this script's loop (aiohttp; tritonclient's gRPC aio), one process, one event loop"


# A probe in a process of its own: a 1-text /v1/embeddings every PROBE_EVERY_S, timed by a client whose event loop
# carries nothing else (the load generator's own loop, 200 clients on the same cores, adds its lag to every latency
# it measures; the probe's say what the server answered, refusals and admitted requests alike).
PROBE_EVERY_S = 0.25
PROBE = """
import json, sys, time, urllib.request, urllib.error
url, seconds, every, headers = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
body = json.dumps({"input": ["a probe of the server's answer time"]}).encode()
seen, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=120) as answer:
            answer.read()
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError:
        status = 0
    seen.append((status, time.monotonic() - started))
    time.sleep(max(0.0, every - (time.monotonic() - started)))
print(json.dumps(seen))
"""


def start_probe(proxy_url, seconds, headers):
    return subprocess.Popen([sys.executable, "-c", PROBE, proxy_url + "/v1/embeddings", str(seconds),
                             str(PROBE_EVERY_S), json.dumps(headers)], stdout=subprocess.PIPE, text=True)


def probe_row(process):
    """The probe's answers: how many, refused (429/503) with their p95 / p99 ms, answered with their p50 / p99 ms."""
    out, _ = process.communicate(timeout=300)
    seen = json.loads(out or "[]")
    refused = [s for status, s in seen if status in REFUSED_HTTP]
    answered = [s for status, s in seen if status == 200]

    def p(values, q):
        return float(np.percentile(values, q)) * 1000 if values else float("nan")
    return {"requests": len(seen), "refused": len(refused), "refused_p95_ms": p(refused, 95),
            "refused_p99_ms": p(refused, 99), "answered": len(answered), "answered_p50_ms": p(answered, 50),
            "answered_p99_ms": p(answered, 99), "other": len(seen) - len(refused) - len(answered)}


def notes(rows, setup):
    """The run's setting under its table: the corpus, the routes, the load generator, the background load per level,
    and what was declined up front."""
    lines = [f"- Corpus: {setup['corpus_line']}.",
             f"- Routes in turn: {', '.join(setup['routes'])}"
             + (f" (heavy routes: {setup['heavy_texts']} passages a request)"
                if set(setup["routes"]) & set(HEAVY_ROUTES) else "") + ".",
             f"- Load generator: {setup['client']}."]
    for row in rows:
        lines.append(f"- {row['clients']} clients: " + (row["background"]["line"] if row.get("background")
                                                        else "background load: off") + ".")
        if row.get("probe"):
            probe = row["probe"]
            lines.append(f"  - probe (a 1-text request every {PROBE_EVERY_S:g} s from a process of its own): "
                         f"{probe['requests']} sent, {probe['refused']} refused in {probe['refused_p95_ms']:.1f} / "
                         f"{probe['refused_p99_ms']:.1f} ms (p95 / p99), {probe['answered']} answered in "
                         f"{probe['answered_p50_ms']:.0f} / {probe['answered_p99_ms']:.0f} ms (p50 / p99), "
                         f"{probe['other']} other.")
        if row.get("declined"):
            lines.append(f"  - declined up front (4xx other than 429): "
                         f"{', '.join(f'{k} × {v}' for k, v in sorted(row['declined'].items()))}.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="8,50,200", help="client counts, one run each (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=300, help="length of each run (default %(default)s)")
    parser.add_argument("--repository", help="an exported repository (default: model_repository/ if it holds an "
                        "export, else all-MiniLM-L6-v2 exported into bench/results/repository)")
    parser.add_argument("--edit", action="append", default=[], help="MODEL:TEXT, ModelConfig text merged "
                        "into the scratch copy's MODEL/config.pbtxt (bench/experiment.py's --edit), e.g. to try other "
                        "queue bounds")
    parser.add_argument("--routes", default=",".join(ROUTES), help="the routes the clients take in turn (default "
                        "%(default)s; also " + ", ".join(HEAVY_ROUTES) + "; a route named twice is taken twice as "
                        "often), or a mix: " + "; ".join(f"{k}: {','.join(v)}" for k, v in MIXES.items()) +
                        ". proxy_queries,proxy_passages,proxy_rerank: the HTTP front alone")
    parser.add_argument("--heavy-texts", type=int, default=48, help="passages per proxy_similarity and "
                        "proxy_rerank_large request (default %(default)s)")
    parser.add_argument("--corpus", choices=CORPORA, default="multilingual",
                        help="multilingual: 26 languages and scripts, queries of 2-90 tokens and passages of 60 to "
                        "the max length (bench/corpus.py's multilingual()); english: Python's reference prose, queries "
                        "of 5-30 tokens and passages of 100-500; mixed-lengths (issue 69, not the gate's tuning "
                        "corpus): both sources, one-word queries to passages at the max length, scripts mixed within "
                        "passages (bench/corpus.py's mixed_lengths()) (default %(default)s)")
    parser.add_argument("--client", choices=CLIENTS, default="aiohttp", help="what sends the /v1/embeddings "
                        "requests: aiohttp (this script's loop, the gate's tuning) or openai (the OpenAI SDK's "
                        "AsyncOpenAI); the other HTTP routes go through aiohttp (default %(default)s)")
    background_load.add_arguments(parser)
    parser.add_argument("--queries", type=int, default=400, help="queries in the corpus (default %(default)s)")
    parser.add_argument("--passages", type=int, default=200, help="passages in the corpus (default %(default)s)")
    parser.add_argument("--output", default=os.path.join(common.RESULTS, "overload"), help="results folder")
    parser.add_argument("--short", action="store_true", help="a smoke: no pause between levels (a level ends once "
                        "every client's last request is answered), the server killed at the end")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    routes = MIXES.get(args.routes) or tuple(args.routes.split(","))
    if set(routes) - set(ROUTES + HEAVY_ROUTES):
        parser.error(f"--routes: unknown {sorted(set(routes) - set(ROUTES + HEAVY_ROUTES))}; known: "
                     f"{', '.join(ROUTES + HEAVY_ROUTES)}, or a mix: {', '.join(MIXES)}")

    repository, manifest, tokenizer = scratch_export(args.repository, args.output, args.edit, progress)
    if args.corpus in ("multilingual", "mixed-lengths"):
        build = corpus_lib.multilingual if args.corpus == "multilingual" else corpus_lib.mixed_lengths
        query_texts, passage_texts = build(tokenizer, args.queries, args.passages, max_length=manifest["max_length"])
    else:
        query_texts = corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["queries"], args.queries)
        passage_texts = corpus_lib.build(tokenizer, corpus_lib.WORKLOADS["passages"], args.passages,
                                         max_length=manifest["max_length"])
    queries, passages = [t["text"] for t in query_texts], [t["text"] for t in passage_texts]
    corpus_line = (f"{args.corpus} corpus: {len(queries)} queries of {min(t['tokens'] for t in query_texts)}-"
                   f"{max(t['tokens'] for t in query_texts)} tokens, {len(passages)} passages of "
                   f"{min(t['tokens'] for t in passage_texts)}-{max(t['tokens'] for t in passage_texts)} (sha256 "
                   f"{corpus_lib.digest(query_texts + passage_texts)[:12]})")
    progress(corpus_line)
    load = background_load.from_args(args)
    setup = {"corpus": args.corpus, "corpus_line": corpus_line, "routes": list(routes), "client": client_line(
        args.client), "heavy_texts": args.heavy_texts, "background": load.describe_settings() if load else "off",
        "command": "python -m bench.overload " + " ".join(argv if argv is not None else sys.argv[1:])}
    ports = common.free_ports()
    server = common.start_server(repository, ports, os.path.join(args.output, "tritonserver.log"))
    try:
        common.wait_for_proxy(ports["proxy"])
        grpc_url, proxy_url = f"127.0.0.1:{ports['grpc']}", f"http://127.0.0.1:{ports['proxy']}"
        reference = asyncio.run(reference_vectors(grpc_url, queries + passages))
        workload = Workload(queries, passages, reference, "ensemble", proxy_url, grpc_url,
                            secret("API_KEY"), routes, args.heavy_texts, args.client)  # API_KEY or API_KEY_FILE
        rows = []
        for index, n in enumerate(clients):
            if index and not args.short:
                time.sleep(5)  # what was admitted drains before the next level
            progress(f"{n} clients for {args.seconds:g} s" + (f", {load.describe_settings()}" if load else ""))
            with background_load.running(load):  # each level beside its own load, stopped before the next
                probe = start_probe(proxy_url, args.seconds, workload.headers)
                row = asyncio.run(workload.run(n, args.seconds, server.pid))
                row["probe"] = probe_row(probe)
            row["background"] = load.report() if load else None
            row["setup"] = setup
            rows.append(row)
            progress(json.dumps({k: v for k, v in row.items() if k != "setup"}))
            if load:
                progress(load.describe())
    finally:
        common.stop_server(server, drain=not args.short)
    table = markdown(rows) + "\n\n" + notes(rows, setup)
    print(table)
    with open(os.path.join(args.output, "overload.json"), "w", encoding="utf-8") as handle:
        json.dump(rows, handle, indent=1)
    with open(os.path.join(args.output, "overload.md"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    top, base = rows[-1], rows[0]
    checks = {
        "goodput >= 90 % of the lowest N": top["goodput_texts_s"] >= 0.9 * base["goodput_texts_s"],
        "no 504 and no client timeout": top["timeouts_504"] + top["errors"].get("client timeout", 0) == 0,
        "refusals within 100 ms (p95)": not top["refused"] or top["refused_p95_ms"] <= 100,
        "p99 <= 3x the lowest N's": top["answered_p99_ms"] <= 3 * base["answered_p99_ms"],
        "0 misrouted": all(row["misrouted"] == 0 for row in rows),
    }
    for name, met in checks.items():
        print(f"{'met    ' if met else 'MISSED '} {name}")


if __name__ == "__main__":
    main()
