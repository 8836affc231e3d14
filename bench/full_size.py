"""The default model at its real size on CPU (issue 71): a random-weight folder in BAAI/bge-m3's exact layout
(XLM-R large: 24 layers, hidden 1024, 16 heads, 8,194 positions, the 250k tokenizer, sparse_linear.pt and
colbert_linear.pt, sentence-transformers' CLS pooling), exported once, served by the real tritonserver, and measured
against its in-process ceiling (onnxruntime on the same model.onnx, in this process) in the same run.

    python -m bench.full_size build                      # the checkpoint (2.3 GB) in bench/results/full_size/bge-m3
    python -m bench.full_size export                     # build/export.py on it (~16 min on 2 cores, 7.5 GiB peak)
    python -m bench.full_size measure                    # queries, passages, the 8k text, RSS -> docs/full-size.md

No network: the weights are random (timings and memory do not depend on their values); the tokenizer is
tests/fixtures/xlmr-tokenizer, bge-m3's own.
"""
import argparse
import json
import os
import subprocess
import sys
import time

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(PROJECT, "bench", "results", "full_size")
CHECKPOINT = os.path.join(WORK, "bge-m3")
REPOSITORY = os.path.join(WORK, "repository")
MAX_LENGTH = 8192


def build_checkpoint(folder=CHECKPOINT, seed=71):
    """bge-m3's files with random weights: config.json and model.safetensors (XLMRobertaModel, as the hub's
    pytorch_model.bin loads), the tokenizer, the two heads and the sentence-transformers modules (CLS, normalize)."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from bench import common

    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(seed)
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                              intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
                              layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    XLMRobertaModel(config).eval().save_pretrained(folder)
    common.write_xlmr_tokenizer(folder)
    torch.save(torch.nn.Linear(1024, 1).state_dict(), os.path.join(folder, "sparse_linear.pt"))
    torch.save(torch.nn.Linear(1024, 1024).state_dict(), os.path.join(folder, "colbert_linear.pt"))
    files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
        "sentence_bert_config.json": {"max_seq_length": MAX_LENGTH, "do_lower_case": False},
        "1_Pooling/config.json": {"word_embedding_dimension": 1024, "pooling_mode_cls_token": True,
                                  "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                                  "pooling_mode_mean_sqrt_len_tokens": False},
        "config_sentence_transformers.json": {"__version__": {"sentence_transformers": "2.2.2"}},
    }
    for name, content in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(content, handle, indent=2)
    os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)
    return folder


def export(folder=CHECKPOINT, repository=REPOSITORY):
    """build/export.py on the folder, as a user runs it (all three outputs, external data by size); its peak RSS."""
    started = time.monotonic()
    command = [sys.executable, os.path.join(PROJECT, "build", "export.py"), "--model", folder,
               "--repository", repository]
    result = subprocess.run(["/usr/bin/time", "-v", *command], stderr=subprocess.PIPE, text=True)
    sys.stderr.write(result.stderr)
    if result.returncode:
        raise SystemExit(f"full_size: the export failed ({result.returncode})")
    peak = next((line.split(":")[1].strip() for line in result.stderr.splitlines()
                 if "Maximum resident set size" in line), "?")
    print(f"full_size: exported in {time.monotonic() - started:.0f} s, peak RSS {peak} kB")


# ---------------------------------------------------------------- measure
QUERY_CLIENTS, PASSAGE_CLIENTS = 8, 4  # in flight, each a closed loop (the load)
LONG_TOKENS = (4000, 8000)  # a long text the server can finish in its timeout on 2 cores, and one it cannot
SHORT_AFTER_S = 2.0  # the short query goes this long after the long text


def server_rss_gib(pid):
    """tritonserver's resident memory and its stubs', GiB (bench/overload.py's footprint of the server's processes)."""
    from bench import overload

    return overload.footprint_mb(pid)[0] / 1024


def texts(tokenizer):
    """The queries and passages of bench/corpus.py (5-30 and 100-500 tokens) and a text of each LONG_TOKENS."""
    from bench import corpus

    queries = [t["text"] for t in corpus.build(tokenizer, corpus.WORKLOADS["queries"], 200)]
    passages = [t["text"] for t in corpus.build(tokenizer, corpus.WORKLOADS["passages"], 100)]
    words = " ".join(corpus._paragraphs()).split()
    return queries, passages, [corpus._cut(tokenizer, words, tokens - 2) for tokens in LONG_TOKENS]


def in_process(repository, tokenizer, queries, passages, long_texts):
    """The ceiling: onnxruntime on the served model.onnx in this process, the encoder's threads, batches of as many
    texts as are in flight, of nearby lengths (texts/s), and each long text alone (s)."""
    import numpy as np
    import onnxruntime as ort

    from bench import common

    path = os.path.join(repository, "embedding", "1", "model.onnx")
    path = os.path.join(path, "model.onnx") if os.path.isdir(path) else path
    options = ort.SessionOptions()
    options.intra_op_num_threads = common.encoder_threads(repository)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(batch):
        encoded = [tokenizer.encode(text).ids for text in batch]
        width = max(len(ids) for ids in encoded)
        ids = np.ones((len(batch), width), np.int64)
        mask = np.zeros((len(batch), width), np.int64)
        for row, tokens in enumerate(encoded):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, 1
        session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})

    def rate(items, size, seconds):
        items = sorted(items, key=len)  # batches of nearby lengths: the least padding, as the server's groups aim at
        run(items[:size])
        started, done = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            run(items[done % len(items):done % len(items) + size] or items[:size])
            done += size
        return done / (time.monotonic() - started)

    result = {"queries_per_s": rate(queries, QUERY_CLIENTS, 20), "passages_per_s": rate(passages, PASSAGE_CLIENTS, 30)}
    for tokens, text in zip(LONG_TOKENS, long_texts):
        started = time.monotonic()
        run([text])
        result[f"long_{tokens}_s"] = time.monotonic() - started
    return result


def closed_loop(url, items, clients, seconds):
    """`clients` threads each posting one text at a time to /v1/embeddings for `seconds`: texts served per second,
    answers by status, the served ones' latency percentiles."""
    import threading

    import httpx

    statuses, latencies, lock, stop = {}, [], threading.Lock(), time.monotonic() + seconds

    def client(index):
        with httpx.Client(base_url=url, timeout=120) as http:
            i = index
            while time.monotonic() < stop:
                started = time.monotonic()
                response = http.post("/v1/embeddings", json={"input": [items[i % len(items)]]})
                with lock:
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.status_code == 200:
                        latencies.append(time.monotonic() - started)
                    elif response.status_code == 429:
                        time.sleep(float(response.headers.get("retry-after", "1")))
                i += clients
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    latencies.sort()
    answers = sum(statuses.values())
    return {"texts_per_s": len(latencies) / elapsed, "statuses": statuses,
            "refused_share": statuses.get(429, 0) / max(1, answers),
            "p50_s": latencies[len(latencies) // 2] if latencies else None,
            "p95_s": latencies[int(len(latencies) * 0.95)] if latencies else None}


def long_beside_short(url, long_text, short_text):
    """The long text, and a short query SHORT_AFTER_S later: each one's status, seconds and (refused) message."""
    import threading

    import httpx

    answers = {}

    def post(name, text, delay):
        time.sleep(delay)
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=180) as http:
            response = http.post("/v1/embeddings", json={"input": [text]})
        answers[name] = {"status": response.status_code, "seconds": round(time.monotonic() - started, 2),
                         "message": None if response.status_code == 200 else response.text[:300]}
    threads = [threading.Thread(target=post, args=("long", long_text, 0)),
               threading.Thread(target=post, args=("short", short_text, SHORT_AFTER_S))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def measure(seconds=60, output=None, edits=(), ceiling=True):
    from bench import common, experiment
    from bench import corpus as corpus_lib

    repository = common.scratch_repository(REPOSITORY, os.path.join(WORK, "serve"))
    experiment.edit_configs(repository, edits)
    tokenizer = corpus_lib.load_tokenizer(os.path.join(repository, "tokenizer", "1", "tokenizer.json"))
    tokenizer.no_truncation()
    queries, passages, long_texts = texts(tokenizer)
    print(f"full_size: {len(queries)} queries, {len(passages)} passages, long texts of "
          f"{[len(tokenizer.encode(text).ids) for text in long_texts]} tokens "
          f"({[len(text) for text in long_texts]} bytes)", flush=True)
    ceiling = in_process(repository, tokenizer, queries, passages, long_texts) if ceiling else None
    print(f"full_size: in process {json.dumps(ceiling)}", flush=True)
    ports = common.free_ports()
    started = time.monotonic()
    server = common.start_server(repository, ports, os.path.join(WORK, "tritonserver.log"), timeout_s=600)
    result = {"ceiling": ceiling}
    try:
        common.wait_for_proxy(ports["proxy"], timeout_s=120)
        result["ready_s"] = time.monotonic() - started
        url = f"http://127.0.0.1:{ports['proxy']}"
        closed_loop(url, queries + passages, 2, 10)  # the gate's rate measured, as on a server that has served
        result["queries"] = closed_loop(url, queries, QUERY_CLIENTS, seconds)
        print(f"full_size: queries {json.dumps(result['queries'])}", flush=True)
        result["passages"] = closed_loop(url, passages, PASSAGE_CLIENTS, seconds)
        print(f"full_size: passages {json.dumps(result['passages'])}", flush=True)
        for tokens, text in zip(LONG_TOKENS, long_texts):
            time.sleep(2)
            row = {"rss_before_gib": server_rss_gib(server.pid), **long_beside_short(url, text, queries[0])}
            time.sleep(5)
            row["rss_after_gib"] = server_rss_gib(server.pid)
            result[f"long_{tokens}"] = row
            print(f"full_size: a text of {tokens} tokens {json.dumps(row)}", flush=True)
    finally:
        common.stop_server(server)
    with open(output or os.path.join(WORK, "measure.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(report(result))
    return result


def report(result):
    ceiling = result["ceiling"]
    lines = ["| load | served texts/s | in-process ceiling | ratio | refused (429) | p50 / p95 s |",
             "|---|---|---|---|---|---|"]
    for name, clients, key in (("queries", QUERY_CLIENTS, "queries_per_s"), ("passages", PASSAGE_CLIENTS,
                                                                             "passages_per_s")):
        row = result[name]
        top = f"{ceiling[key]:.2f} | {row['texts_per_s'] / ceiling[key]:.2f}" if ceiling else "- | -"
        lines.append(f"| {name}, {clients} in flight | {row['texts_per_s']:.2f} | {top} | "
                     f"{row['refused_share']:.1%} of {sum(row['statuses'].values())} | "
                     f"{row['p50_s'] or 0:.2f} / {row['p95_s'] or 0:.2f} |")
    for tokens in LONG_TOKENS:
        row = result[f"long_{tokens}"]
        long, short = row["long"], row["short"]
        alone = f"{ceiling[f'long_{tokens}_s']:.1f} s" if ceiling else "not measured"
        lines += ["", f"- A text of {tokens:,} tokens: {long['status']} after {long['seconds']} s (in process alone: "
                  f"{alone}); a short query sent {SHORT_AFTER_S:g} s after it: {short['status']} after "
                  f"{short['seconds']} s. Server RSS (tritonserver and its stubs): {row['rss_before_gib']:.2f} GiB "
                  f"before, {row['rss_after_gib']:.2f} GiB 5 s after its answer."]
        if long["message"]:
            lines.append(f"  Its answer: {long['message']}")
    lines.append(f"- Ready {result['ready_s']:.0f} s after start.")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["build", "export", "measure"])
    parser.add_argument("--seconds", type=float, default=60, help="each closed-loop load's length (measure)")
    parser.add_argument("--edit", action="append", default=[],
                        help="MODEL:TEXT merged into the served copy's MODEL/config.pbtxt, as bench.experiment's")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the in-process ceiling (measure)")
    args = parser.parse_args(argv)
    if args.step == "build":
        print(build_checkpoint())
    elif args.step == "export":
        export()
    else:
        measure(args.seconds, edits=args.edit, ceiling=not args.no_ceiling)


if __name__ == "__main__":
    main()
