"""What bge-m3's sparse and ColBERT outputs cost the encoder (issue 10: target <= 10% on passages), and how many
bytes per text each output adds.

A tiny test model says nothing about cost, so this builds a random XLM-R of bge-m3's *shape* (hidden 1024, 16
attention heads, FFN 4096, the real 250,002-token vocabulary and the XLM-R tokenizer) but with only a few layers,
plus random bge-m3 heads (sparse_linear 1024->1, colbert_linear 1024->1024). build/export.py exports it twice, as a
user would: `--outputs dense` (what serving cost before) and all three outputs. Everything is timed with
onnxruntime in-process on CPU (as Triton's onnxruntime backend runs it: every graph output computed), on passages of
fixed token lengths at a few batch sizes:
  - the heads alone: onnx.utils.extract_model cuts the sparse part, the ColBERT part and both out of the
    all-outputs graph, from the last hidden state on. Their cost does not depend on the encoder's depth;
  - the dense encoder at each depth: overhead = heads / dense, and with two depths (default 2 and 4 layers) the
    dense time is fitted as a + b * layers and the overhead projected onto bge-m3's 24 layers;
  - end to end, as a cross-check: the dense and all-outputs model.onnx run alternately, round after round, so that
    other load on the machine hits both alike; the median of the per-round ratios.

    python -m bench.studies.m3_cost                                  # markdown to stdout (~10 min on 2 busy cores)
    python -m bench.studies.m3_cost --output docs/m3-cost.md --work-dir /tmp/m3cost --layers 2,4 --batch-sizes 1,4
"""
import argparse
import json
import lzma
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

from bench import common

TOKENIZER_FIXTURE = os.path.join(common.PROJECT, "tests", "fixtures", "xlmr-tokenizer")
HEADS = {"sparse": ["sparse_indices", "sparse_values", "sparse_count"],
         "colbert": ["colbert_vectors", "colbert_length"]}
OUTPUTS = {"dense": ["embedding"], "all": ["embedding"] + HEADS["sparse"] + HEADS["colbert"]}
BGE_M3_LAYERS = 24
PAD, EOS = 1, 2


def progress(message):
    print(f"m3_cost: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the model
def tokenizer_folder(folder):
    os.makedirs(folder, exist_ok=True)
    with lzma.open(os.path.join(TOKENIZER_FIXTURE, "tokenizer.json.xz")) as packed, \
            open(os.path.join(folder, "tokenizer.json"), "wb") as out:
        shutil.copyfileobj(packed, out)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(TOKENIZER_FIXTURE, name), os.path.join(folder, name))
    return folder


def build_model(folder, layers, tokenizer_dir, sample_ids, seed=0):
    """bge-m3's shape with `layers` layers, random weights; the sparse head's bias is set so that about 2 tokens in 3
    get a weight (the count changes only the bytes of the proxy's JSON: the graph's sorts cover the whole row)."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(seed)
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                              intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
                              layer_norm_eps=1e-5, pad_token_id=PAD, bos_token_id=0, eos_token_id=EOS)
    model = XLMRobertaModel(config).eval()
    model.save_pretrained(folder)
    for name in os.listdir(tokenizer_dir):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    sparse, colbert = torch.nn.Linear(1024, 1), torch.nn.Linear(1024, 1024)
    with torch.no_grad():
        ids = torch.from_numpy(sample_ids[:, :128])
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.reshape(-1, 1024)
        projected = hidden @ sparse.weight.T
        sparse.bias.fill_(-float(projected.quantile(1 / 3)))
    torch.save(sparse.state_dict(), os.path.join(folder, "sparse_linear.pt"))
    torch.save(colbert.state_dict(), os.path.join(folder, "colbert_linear.pt"))
    del model
    return folder


def export(folder, repository, name, outputs, max_length):
    options = ["--name", name, "--max-length", str(max_length), *(["--outputs", outputs] if outputs else [])]
    common.run_export(folder, repository, *options, who="m3_cost")
    with open(os.path.join(repository, name, "1", "export.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    return os.path.join(repository, manifest["onnx"])


def extract(source, target, outputs, inputs=("input_ids", "attention_mask")):
    import onnx.utils

    onnx.utils.extract_model(source, target, list(inputs), outputs)
    return target


# ---------------------------------------------------------------- inputs
def token_stream(tokenizer_json, count):
    """Token ids of real English prose (bench/corpus.py's source), no special tokens."""
    from tokenizers import Tokenizer

    from bench.corpus import _paragraphs

    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = []
    for paragraph in _paragraphs():
        ids += tokenizer.encode(paragraph, add_special_tokens=False).ids
        if len(ids) >= count:
            return np.array(ids[:count], dtype=np.int64)
    raise RuntimeError("not enough text")


def passages(stream, batch, length, offset=0):
    """`batch` passages of exactly `length` tokens (<s> ... </s>), consecutive windows of the stream."""
    ids = np.empty((batch, length), dtype=np.int64)
    for row in range(batch):
        start = offset + row * (length - 2)
        ids[row] = [0, *stream[start:start + length - 2], EOS]
    return ids, np.ones_like(ids)


# ---------------------------------------------------------------- timing
def session(path, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def extract_heads(all_path, work):
    """The heads alone, cut from the all-outputs graph: last hidden state (+ ids, mask) in, sparse and/or ColBERT
    outputs out. Their cost does not depend on the encoder's depth."""
    import onnx

    graph = onnx.load(all_path, load_external_data=False).graph
    hidden = [n for n in graph.node if n.op_type == "LayerNormalization"][-1].output[0]
    heads = {}
    for name, outputs in (("sparse", HEADS["sparse"]), ("colbert", HEADS["colbert"]),
                          ("sparse+colbert", HEADS["sparse"] + HEADS["colbert"])):
        inputs = [hidden, "attention_mask"] + (["input_ids"] if "sparse" in name else [])
        heads[name] = extract(all_path, os.path.join(work, f"heads-{name}.onnx"), outputs, inputs)
    return hidden, heads


def timed(session_, feed):
    """(wall seconds, CPU seconds of this process) of one run. CPU time is what the run itself consumed: other
    processes on the machine delay a run's wall time, not its CPU time (with one intra-op thread, no spinning
    thread pool counts either)."""
    wall, cpu = time.perf_counter(), time.process_time()
    session_.run(None, feed)
    return time.perf_counter() - wall, time.process_time() - cpu


def run_times(session_, feed, rounds):
    session_.run(None, feed)  # warm-up at this shape
    return [timed(session_, feed) for _ in range(rounds)]


def interleaved(sessions, feed, rounds):
    """Rounds of every session in turn (the order rotating), so that other load on the machine hits them alike;
    returns {name: [(wall, CPU) seconds per round]}."""
    names = list(sessions)
    for name in names:  # warm-up at this shape
        sessions[name].run(None, feed)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(sessions[name], feed))
    return times


def bytes_per_text(session_all, stream, length):
    """KServe binary bytes of each output for one passage of `length` tokens, and the JSON bytes of /v1/encode."""
    import orjson

    ids, mask = passages(stream, 1, length)
    out = dict(zip(OUTPUTS["all"], session_all.run(OUTPUTS["all"], {"input_ids": ids, "attention_mask": mask})))
    count, vectors = int(out["sparse_count"][0, 0]), int(out["colbert_length"][0, 0])
    option = orjson.OPT_SERIALIZE_NUMPY
    return {
        "tokens": length,
        "dense": out["embedding"][0].nbytes,
        "sparse": out["sparse_indices"][0].nbytes + out["sparse_values"][0].nbytes + out["sparse_count"][0].nbytes,
        "sparse_entries": count,
        "colbert": out["colbert_vectors"][0].nbytes + out["colbert_length"][0].nbytes,
        "json_dense": len(orjson.dumps(out["embedding"][0], option=option)),
        "json_sparse": len(orjson.dumps({"indices": out["sparse_indices"][0, :count],
                                         "values": out["sparse_values"][0, :count]}, option=option)),
        "json_colbert": len(orjson.dumps(np.ascontiguousarray(out["colbert_vectors"][0, :vectors]), option=option)),
    }


# ---------------------------------------------------------------- report
def kib(n):
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n} B"


def pct(x):
    return f"{x * 100:+.1f}%"


def markdown(run):
    layers = run["layers"]
    lines = ["# What bge-m3's sparse and ColBERT outputs cost the encoder", "",
             f"`python -m bench.studies.m3_cost {' '.join(run['argv'])}` on {run['machine']}; onnxruntime {run['ort']} "
             f"in-process on CPU, intra-op threads: {run['threads'] or 'all cores'}. A random XLM-R of bge-m3's shape "
             f"(hidden 1024, 16 heads, FFN 4096, vocabulary 250,002) with {' and '.join(map(str, layers))} layers "
             f"and random bge-m3 heads, exported by build/export.py with `--outputs dense` and with all three "
             f"outputs; passages of exactly the given tokens (<s> and </s> included), one batch padded to them.", "",
             "- Times are CPU time of the benchmark process (one intra-op thread unless --threads says otherwise), "
             "the fastest of their runs: on a shared machine other processes stretch a run's wall time but not the "
             "CPU time it consumes (wall times and every run: the .json beside this file).",
             "- **heads**: the sparse and ColBERT part of the all-outputs graph alone (cut with "
             f"onnx.utils.extract_model from the last hidden state on; {run['head_rounds']} runs). Its cost does "
             "not depend on the encoder's depth.",
             "- **overhead** = heads / dense encoder time; **24 layers**: dense time fitted as a + b·layers on the "
             "depths measured and extrapolated to bge-m3's 24 layers." if len(layers) > 1 else
             "- **overhead** = heads / dense encoder time.",
             f"- **end-to-end**: the two exported model.onnx run alternately, {run['rounds']} rounds each; fastest "
             "all / fastest dense − 1 (noisier: the difference of two large times).", ""]
    head = ["tokens", "batch"] + [f"dense ms, {n} layers" for n in layers] + \
        ["sparse head ms", "ColBERT head ms", "both heads ms"] + [f"overhead, {n} layers" for n in layers] + \
        (["overhead, 24 layers"] if len(layers) > 1 else []) + [f"end-to-end, {n} layers" for n in layers]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in run["cells"]:
        row = [str(cell["tokens"]), str(cell["batch"])] + [f"{cell['dense_ms'][str(n)]:.1f}" for n in layers]
        row += [f"{cell['heads_ms'][h]:.2f}" for h in ("sparse", "colbert", "sparse+colbert")]
        row += [pct(cell["overhead"][str(n)]) for n in layers]
        row += [pct(cell["overhead_24"])] if len(layers) > 1 else []
        row += [pct(cell["end_to_end"][str(n)]) for n in layers]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Bytes per text (one passage per request: rows of a request are padded to its longest text). "
                  "KServe = binary tensor bytes as the ensemble returns them; JSON = the `/v1/encode` item's field.",
              "", "| tokens | dense | sparse (KServe, padded) | sparse entries | ColBERT (KServe) | dense JSON | "
              "sparse JSON | ColBERT JSON |", "|---|---|---|---|---|---|---|---|"]
    for b in run["bytes"]:
        lines.append(f"| {b['tokens']} | {kib(b['dense'])} | {kib(b['sparse'])} | {b['sparse_entries']} | "
                     f"{kib(b['colbert'])} | {kib(b['json_dense'])} | {kib(b['json_sparse'])} | "
                     f"{kib(b['json_colbert'])} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,4", help="encoder depths, comma-separated (default %(default)s)")
    parser.add_argument("--lengths", default="100,250,500", help="passage tokens (default %(default)s)")
    parser.add_argument("--batch-sizes", default="1,4", help="texts per run (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=8, help="end-to-end rounds per cell (default %(default)s)")
    parser.add_argument("--head-rounds", type=int, default=30, help="runs of the heads alone (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default %(default)s: "
                        "CPU time then measures the work itself; 0 = all cores, as the encoder's config.pbtxt)")
    parser.add_argument("--output", help="also write the markdown here (and the raw numbers beside it, .json)")
    parser.add_argument("--work-dir", help="keep the models and exports here, reused by the next run (default: a "
                        "temporary folder)")
    return parser.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import onnxruntime

    layers = sorted(int(n) for n in args.layers.split(","))
    lengths = [int(n) for n in args.lengths.split(",")]
    batch_sizes = [int(n) for n in args.batch_sizes.split(",")]
    shapes = [(n, b) for n in lengths for b in batch_sizes]
    work = args.work_dir or tempfile.mkdtemp(prefix="m3_cost_")
    os.makedirs(work, exist_ok=True)
    started = time.monotonic()
    try:
        tokenizer_dir = tokenizer_folder(os.path.join(work, "tokenizer"))
        stream = token_stream(os.path.join(tokenizer_dir, "tokenizer.json"), max(batch_sizes) * max(lengths) + 1024)
        repository = os.path.join(work, "repository")
        cells = {shape: {"tokens": shape[0], "batch": shape[1], "dense_ms": {}, "end_to_end": {},
                         "dense_wall_ms": {}, "end_to_end_wall": {}, "heads_ms": {}, "heads_wall_ms": {},
                         "times": {}}
                 for shape in shapes}
        bytes_rows = []
        for depth in layers:
            folder = os.path.join(work, f"bge-m3-shaped-{depth}-layers")
            if not os.path.exists(os.path.join(folder, "colbert_linear.pt")):
                progress(f"building a {depth}-layer bge-m3-shaped model")
                build_model(folder, depth, tokenizer_dir, passages(stream, 4, 130)[0])
            paths = {}
            for variant, outputs in (("dense", "dense"), ("all", None)):
                name = f"l{depth}-{variant}"
                paths[variant] = os.path.join(repository, f"{name}_embedding", "1", "model.onnx")
                if not os.path.isfile(paths[variant]):
                    progress(f"exporting {name}")
                    paths[variant] = export(folder, repository, name, outputs, max(lengths))
            sessions = {v: session(paths[v], args.threads) for v in ("dense", "all")}
            if depth == layers[0]:
                bytes_rows = [bytes_per_text(sessions["all"], stream, n) for n in lengths]
                hidden, heads = extract_heads(paths["all"], work)
                head_sessions = {h: session(path, args.threads) for h, path in heads.items()}
                rng = np.random.default_rng(0)
                for n, b in shapes:
                    ids, mask = passages(stream, b, n)
                    feed = {hidden: rng.standard_normal((b, n, 1024), dtype=np.float32), "input_ids": ids,
                            "attention_mask": mask}
                    for h, s in head_sessions.items():
                        runs = run_times(s, {i.name: feed[i.name] for i in s.get_inputs()}, args.head_rounds)
                        cells[n, b]["heads_ms"][h] = min(cpu for _, cpu in runs) * 1000
                        cells[n, b]["heads_wall_ms"][h] = min(wall for wall, _ in runs) * 1000
                del head_sessions
            for n, b in shapes:
                ids, mask = passages(stream, b, n)
                times = interleaved(sessions, {"input_ids": ids, "attention_mask": mask}, args.rounds)
                cell = cells[n, b]
                cpu = {v: [c for _, c in times[v]] for v in times}
                wall = {v: [w for w, _ in times[v]] for v in times}
                cell["dense_ms"][str(depth)] = min(cpu["dense"]) * 1000
                cell["dense_wall_ms"][str(depth)] = min(wall["dense"]) * 1000
                cell["end_to_end"][str(depth)] = min(cpu["all"]) / min(cpu["dense"]) - 1
                cell["end_to_end_wall"][str(depth)] = min(wall["all"]) / min(wall["dense"]) - 1
                cell["times"][str(depth)] = times
                progress(f"{depth} layers, {n} tokens, batch {b}: dense {cell['dense_ms'][str(depth)]:.1f} ms "
                         f"(wall {cell['dense_wall_ms'][str(depth)]:.1f}), heads "
                         f"{cell['heads_ms']['sparse+colbert']:.2f} ms, "
                         f"end-to-end {pct(cell['end_to_end'][str(depth)])}")
            del sessions
        for cell in cells.values():
            heads_ms = cell["heads_ms"]["sparse+colbert"]
            cell["overhead"] = {d: heads_ms / ms for d, ms in cell["dense_ms"].items()}
            if len(layers) > 1:
                b, a = np.polyfit(np.array(layers, dtype=float), [cell["dense_ms"][str(n)] for n in layers], 1)
                cell["overhead_24"] = heads_ms / (a + BGE_M3_LAYERS * b)
        run = {"argv": argv, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "ort": onnxruntime.__version__, "threads": args.threads, "rounds": args.rounds,
               "head_rounds": args.head_rounds, "layers": layers, "cells": list(cells.values()),
               "bytes": bytes_rows, "seconds": time.monotonic() - started}
        text = markdown(run)
        print(text)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(text)
            with open(os.path.splitext(args.output)[0] + ".json", "w", encoding="utf-8") as handle:
                json.dump(run, handle, indent=1, default=float)
        progress(f"done in {run['seconds']:.0f} s")
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
