"""Fairness under heavy clients (issue 69, from issue 59's finding): light requests beside clients that loop heavy ones.

HEAVY clients (3), each a thread with its own connection, loop a legal TEI `POST /similarity` of --heavy-sentences
(600) sentences of --heavy-words (100) words (consecutive words of Python's reference prose, bench/corpus.py's source,
each cut to the model's max length if it were longer), honouring Retry-After on 429; a light client sends a 1-text
`POST /v1/embeddings` every --light-every (1.0) s for --seconds (120), starting once the heavy requests are in flight,
on a fixed schedule (an open loop: a slow answer does not delay the next request).
Then the heavy clients stop, each once its request in flight is answered (so a request that runs past its deadline
shows as a 504). Every answer is counted by status and error code: an up-front refusal of a heavy request may be a
429 (Retry-After) or another 4xx (e.g. too big for the deadline), after which its client waits 1 s, never retrying
at once; the 429s' messages are counted as the light requests' refusal reasons. --background-load runs the measured
stretch beside busy processes on the same cores (bench/background_load.py), and the report says what they got.

Targets (issue 69): light requests >= 95 % served, their p95 <= 3 s (over every light request, served or not), and
no heavy request past its deadline: 0 HTTP 504 (each served or refused up front), no client timeout.

    python -m bench.fairness [--seconds 120] [--background-load] [--repository DIR]
    python -m bench.fairness --seconds 3 --heavy-sentences 20 --heavy-words 10 --short      # a smoke
"""
import argparse
import json
import math
import os
import random
import re
import sys
import threading
import time

import httpx
import numpy as np

from bench import background_load, common
from bench import corpus as corpus_lib
from bench.experiment import scratch_export
from model_library.triton_server import secret

CLIENT_TIMEOUT_S = 300  # past the proxy's request_timeout_s (60): its 504 shows, not the client's own give-up
LIGHT_TIMEOUT_S = 60


def progress(message):
    print(f"[fairness {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the texts
def heavy_sentences(tokenizer, count, words, max_length, seed=0):
    """`count` sentences of `words` consecutive words of the reference prose (from a seeded place each), each cut to
    `max_length` tokens if it is longer: a /similarity with truncate false (TEI's default) takes them all."""
    rng = random.Random(f"fairness:{seed}")
    prose = " ".join(corpus_lib._paragraphs()).split()
    sentences = []
    for _ in range(count):
        start = rng.randrange(len(prose) - words)
        sentences.append(" ".join(prose[start:start + words]))
    for i, encoding in enumerate(tokenizer.encode_batch(sentences)):
        if len(encoding.ids) > max_length:
            sentences[i] = corpus_lib._cut(tokenizer, sentences[i].split(), max_length)
    return sentences


def light_texts():
    """The light client's texts: the multilingual file's sentences (bench/data/multilingual.tsv), in turn."""
    return [sentence for _, sentence in corpus_lib._multilingual_sentences()]


# ---------------------------------------------------------------- the clients
class Tally:
    """One client's answers: latencies of the served, and every other answer by status and error code."""

    def __init__(self):
        self.served, self.refused, self.timeouts_504 = [], [], []  # seconds each
        self.codes, self.messages = {}, {}  # "HTTP 429 overloaded" -> count; message -> count (non-200)
        self.examples = {}  # a message with its numbers as N -> the first one as it came
        self.client_timeouts, self.errors, self.bad_answers = 0, {}, 0
        self.latencies = []  # (status, seconds) of every answer, in order

    def answer(self, status, seconds, content):
        self.latencies.append((status, seconds))
        if status == 200:
            self.served.append(seconds)
            return
        code, message = common.error_of(content)
        key = f"HTTP {status} {code}".strip()
        self.codes[key] = self.codes.get(key, 0) + 1
        reason = f"{status}: " + re.sub(r"\d+(\.\d+)?", "N", message[:160])  # one reason, whatever numbers it names
        self.messages[reason] = self.messages.get(reason, 0) + 1
        self.examples.setdefault(reason, f"{status}: {message[:160]}")
        if status == 504:
            self.timeouts_504.append(seconds)
        elif 400 <= status < 500:
            self.refused.append(seconds)

    def error(self, what):
        self.errors[what] = self.errors.get(what, 0) + 1


def merge(tallies):
    whole = Tally()
    for tally in tallies:
        whole.served += tally.served
        whole.refused += tally.refused
        whole.timeouts_504 += tally.timeouts_504
        whole.latencies += tally.latencies
        whole.client_timeouts += tally.client_timeouts
        whole.bad_answers += tally.bad_answers
        for mine, theirs in ((whole.codes, tally.codes), (whole.messages, tally.messages),
                             (whole.errors, tally.errors)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
        for key, value in tally.examples.items():
            whole.examples.setdefault(key, value)
    return whole


def heavy_client(proxy_url, headers, body, sentences, stop, tally):
    """Loops the heavy request until `stop`; the request in flight when it is set is answered and counted."""
    with httpx.Client(base_url=proxy_url, timeout=CLIENT_TIMEOUT_S, headers=headers) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                response = client.post("/similarity", content=body)
            except httpx.TimeoutException:
                tally.client_timeouts += 1
                continue
            except httpx.HTTPError as error:
                tally.error(type(error).__name__)
                stop.wait(1.0)
                continue
            seconds = time.monotonic() - started
            tally.answer(response.status_code, seconds, response.content)
            if response.status_code == 200:
                scores = response.json()
                if len(scores) != sentences or not all(isinstance(s, float) and math.isfinite(s) for s in scores):
                    tally.bad_answers += 1
            elif response.status_code == 429:
                stop.wait(float(response.headers.get("retry-after", "1")))
            elif response.status_code != 504:  # another 4xx (declined up front) or 5xx: never again at once
                stop.wait(1.0)


def light_client(client, texts, seconds, every, tally):
    """One 1-text /v1/embeddings every `every` s for `seconds`, on a fixed schedule (an open loop: each request in a
    thread of its own, so a slow answer never delays the next request nor thins the sample); returns once every
    request is answered."""
    lock = threading.Lock()

    def one(text):
        sent = time.monotonic()
        try:
            response = client.post("/v1/embeddings", json={"input": [text]})
            with lock:
                tally.answer(response.status_code, time.monotonic() - sent, response.content)
        except httpx.TimeoutException:
            with lock:
                tally.client_timeouts += 1
                tally.latencies.append((None, time.monotonic() - sent))
        except httpx.HTTPError as error:
            with lock:
                tally.error(type(error).__name__)
                tally.latencies.append((None, time.monotonic() - sent))

    began, threads = time.monotonic(), []
    for n in range(max(1, int(seconds / every))):
        time.sleep(max(0.0, began + n * every - time.monotonic()))
        threads.append(threading.Thread(target=one, args=(texts[n % len(texts)],), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=LIGHT_TIMEOUT_S + 10)


def warm_up(client, texts, seconds):
    """8-text requests for `seconds`: the gate has a measured rate before the heavy clients start."""
    began, n = time.monotonic(), 0
    while time.monotonic() - began < seconds:
        response = client.post("/v1/embeddings", json={"input": [texts[(n + k) % len(texts)] for k in range(8)]})
        if response.status_code != 200:
            raise SystemExit(f"fairness: warm-up request answered {response.status_code}: {response.text[:300]}")
        n += 8


# ---------------------------------------------------------------- the report
def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def summary(light, heavy, heavy_clients):
    light_all = [seconds for _, seconds in light.latencies]
    requests = len(light.latencies)
    heavy_all = [seconds for _, seconds in heavy.latencies]
    return {
        "light": {"requests": requests, "served": len(light.served),
                  "served_share": len(light.served) / requests if requests else float("nan"),
                  "p50_s": percentile(light_all, 50), "p95_s": percentile(light_all, 95),
                  "max_s": max(light_all, default=float("nan")),
                  "served_p95_s": percentile(light.served, 95), "refused": len(light.refused),
                  "timeouts_504": len(light.timeouts_504), "codes": light.codes,
                  "refusal_reasons": light.messages, "examples": light.examples,
                  "client_timeouts": light.client_timeouts,
                  "errors": light.errors},
        "heavy": {"requests": len(heavy.latencies), "served": len(heavy.served),
                  "served_per_client": [len(t.served) for t in heavy_clients],
                  "refused_up_front": len(heavy.refused), "timeouts_504": len(heavy.timeouts_504),
                  "codes": heavy.codes, "messages": heavy.messages, "examples": heavy.examples,
                  "client_timeouts": heavy.client_timeouts,
                  "errors": heavy.errors, "bad_answers": heavy.bad_answers,
                  "served_p50_s": percentile(heavy.served, 50), "served_p95_s": percentile(heavy.served, 95),
                  "served_max_s": max(heavy.served, default=float("nan")),
                  "refused_p95_ms": percentile(heavy.refused, 95) * 1000, "all_p50_s": percentile(heavy_all, 50)},
    }


def checks(result):
    light, heavy = result["light"], result["heavy"]
    return {
        "light >= 95 % served": light["served_share"] >= 0.95,
        "light p95 <= 3 s": light["p95_s"] <= 3.0,
        "heavy: 0 HTTP 504 and no client timeout (each served or refused up front)":
            heavy["timeouts_504"] == 0 and heavy["client_timeouts"] == 0,
    }


def markdown(result, setup):
    light, heavy = result["light"], result["heavy"]

    def others(codes, leave_out=()):
        kept = {k: v for k, v in sorted(codes.items()) if not k.startswith(leave_out)}
        return ", ".join(f"{k} × {v}" for k, v in kept.items()) or "0"

    lines = [
        "| client | requests | served | served % | p50 s | p95 s | max s | refused up front (4xx) | 504 | other |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| light: 1-text `/v1/embeddings` every {setup['light_every_s']:g} s | {light['requests']} | "
        f"{light['served']} | {100 * light['served_share']:.1f} | {light['p50_s']:.2f} | {light['p95_s']:.2f} | "
        f"{light['max_s']:.2f} | {others(light['codes'], ('HTTP 5',))} | {light['timeouts_504']} | "
        f"{others({k: v for k, v in light['codes'].items() if k.startswith('HTTP 5') and 'HTTP 504' not in k})}; "
        f"{light['client_timeouts']} client timeouts, {sum(light['errors'].values())} errors |",
        f"| heavy: {setup['heavy_clients']} × `/similarity` of {setup['heavy_sentences']} × {setup['heavy_words']} "
        f"words | {heavy['requests']} | {heavy['served']} | "
        f"{100 * heavy['served'] / heavy['requests'] if heavy['requests'] else float('nan'):.1f} | "
        f"{heavy['served_p50_s']:.1f} | {heavy['served_p95_s']:.1f} | {heavy['served_max_s']:.1f} | "
        f"{others(heavy['codes'], ('HTTP 5',))} | {heavy['timeouts_504']} | "
        f"{others({k: v for k, v in heavy['codes'].items() if k.startswith('HTTP 5') and 'HTTP 504' not in k})}; "
        f"{heavy['client_timeouts']} client timeouts, {sum(heavy['errors'].values())} errors, "
        f"{heavy['bad_answers']} bad answers |",
        "",
        "- Latencies: the light client's over every light request, served or not (the target's p95); the heavy "
        "clients' over the served ones. Messages below with their numbers as N (the first as it came in the JSON).",
        f"- Light refusal reasons: {', '.join(f'{k!r} × {v}' for k, v in light['refusal_reasons'].items()) or 'none'}.",
        f"- Heavy answers other than 200: "
        f"{', '.join(f'{k!r} × {v}' for k, v in heavy['messages'].items()) or 'none'}; served per client "
        f"{heavy['served_per_client']}"
        + (f"; refusals answered in {heavy['refused_p95_ms']:.0f} ms (p95)." if heavy["refused_up_front"] else "."),
        f"- {setup['background_line']}.",
        f"- {setup['model']}, {setup['seconds']:g} s of light requests after {setup['warmup_s']:g} s of warm-up; "
        f"`{setup['command']}`.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the run
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", help="an exported repository (default: model_repository/ if it holds an "
                        "export, else all-MiniLM-L6-v2 exported into bench/results/repository)")
    parser.add_argument("--edit", action="append", default=[], help="MODEL:TEXT, ModelConfig text merged into the "
                        "scratch copy's MODEL/config.pbtxt (bench/experiment.py's --edit)")
    parser.add_argument("--seconds", type=float, default=120, help="how long the light client sends (default "
                        "%(default)s)")
    parser.add_argument("--heavy-clients", type=int, default=3, help="default %(default)s")
    parser.add_argument("--heavy-sentences", type=int, default=600, help="sentences per /similarity (default "
                        "%(default)s)")
    parser.add_argument("--heavy-words", type=int, default=100, help="words per sentence (default %(default)s)")
    parser.add_argument("--light-every", type=float, default=1.0, help="seconds between light requests' starts "
                        "(default %(default)s)")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="8-text requests before the heavy clients start, "
                        "so that the gate has a measured rate (default %(default)s)")
    parser.add_argument("--heavy-lead-s", type=float, default=2.0, help="the heavy clients start this long before the "
                        "light one (default %(default)s)")
    background_load.add_arguments(parser)
    parser.add_argument("--output", default=os.path.join(common.RESULTS, "fairness"), help="results folder")
    parser.add_argument("--short", action="store_true", help="a smoke: the server killed at the end, not drained")
    args = parser.parse_args(argv)

    repository, manifest, tokenizer = scratch_export(args.repository, args.output, args.edit, progress)
    sentences = heavy_sentences(tokenizer, args.heavy_sentences, args.heavy_words, manifest["max_length"])
    tokens = [len(e.ids) for e in tokenizer.encode_batch(sentences)]
    texts = light_texts()
    progress(f"heavy: {len(sentences)} sentences of {args.heavy_words} words, {min(tokens)}-{max(tokens)} tokens "
             f"(mean {sum(tokens) / len(tokens):.0f}); light: {len(texts)} sentences in turn")
    load = background_load.from_args(args)
    key = secret("API_KEY")  # API_KEY or API_KEY_FILE, as the proxy reads it
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    ports = common.free_ports()
    server = common.start_server(repository, ports, os.path.join(args.output, "tritonserver.log"))
    heavy_tallies = [Tally() for _ in range(args.heavy_clients)]
    light = Tally()
    try:
        common.wait_for_proxy(ports["proxy"])
        proxy_url = f"http://127.0.0.1:{ports['proxy']}"
        with httpx.Client(base_url=proxy_url, timeout=LIGHT_TIMEOUT_S, headers=headers) as client:
            warm_up(client, texts, args.warmup_s)
            stop = threading.Event()
            bodies = [json.dumps({"inputs": {"source_sentence": texts[c % len(texts)], "sentences": sentences}})
                      for c in range(args.heavy_clients)]
            threads = [threading.Thread(target=heavy_client, daemon=True, args=(
                proxy_url, headers, bodies[c], len(sentences), stop, heavy_tallies[c]))
                for c in range(args.heavy_clients)]
            progress(f"{args.heavy_clients} heavy clients, then a light request every {args.light_every:g} s for "
                     f"{args.seconds:g} s" + (f"; {load.describe_settings()}" if load else ""))
            with background_load.running(load):
                try:
                    for thread in threads:
                        thread.start()
                    time.sleep(args.heavy_lead_s)  # the heavy requests are in flight
                    light_client(client, texts, args.seconds, args.light_every, light)
                    progress("light client done; the heavy clients stop once their requests in flight are answered")
                finally:
                    stop.set()
                for thread in threads:
                    thread.join(timeout=CLIENT_TIMEOUT_S + 10)
            if any(thread.is_alive() for thread in threads):
                progress("a heavy client is still waiting for its answer past the client timeout")
    finally:
        common.stop_server(server, drain=not args.short)
    result = summary(light, merge(heavy_tallies), heavy_tallies)
    setup = {"model": manifest["model"], "max_length": manifest["max_length"], "seconds": args.seconds,
             "heavy_clients": args.heavy_clients, "heavy_sentences": args.heavy_sentences,
             "heavy_words": args.heavy_words, "heavy_tokens": [min(tokens), max(tokens)],
             "light_every_s": args.light_every, "warmup_s": args.warmup_s,
             "background": load.report() if load else None,
             "background_line": load.describe() if load else "background load: off",
             "client": "httpx (sync), a thread per heavy client, the light client in the main thread",
             "command": "python -m bench.fairness " + " ".join(argv if argv is not None else sys.argv[1:])}
    met = checks(result)
    run = {"setup": setup, **result, "checks": met, "machine": common.machine_info(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    table = markdown(result, setup)
    print(table)
    with open(os.path.join(args.output, "fairness.json"), "w", encoding="utf-8") as handle:
        json.dump(run, handle, indent=1)
    with open(os.path.join(args.output, "fairness.md"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    for name, ok in met.items():
        print(f"{'met    ' if ok else 'MISSED '} {name}")


if __name__ == "__main__":
    main()
