"""In-process baselines: the onnxruntime ceiling, the client's tokenization cost, and the padding probe."""
import asyncio
import time

import numpy as np


def _session(onnx_path, threads, device):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    session = ort.InferenceSession(onnx_path, options, providers=providers)
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise SystemExit("bench: --device cuda but onnxruntime has no CUDA provider (pip install onnxruntime-gpu)")
    return session


def _batches(encodings, batch_size, pad_id):
    """Texts sorted by length, cut into batches, each padded to its own longest text (the best padding)."""
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = [encodings[i] for i in order[start:start + batch_size]]
        batches.append((*_padded(rows, max(len(r) for r in rows), pad_id), sum(len(r) for r in rows)))
    return batches


def _padded(rows, width, pad_id):
    """(input_ids, attention_mask) of token-id rows padded to `width`."""
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for k, row in enumerate(rows):
        ids[k, :len(row)] = row
        mask[k, :len(row)] = 1
    return ids, mask


def _spread(n):
    """0..n-1 in bit-reversed order: 0, n/2, n/4, 3n/4, ... (every prefix samples the whole range)."""
    bits = max(1, (n - 1).bit_length())
    reverse = lambda i: int(format(i, f"0{bits}b")[::-1], 2)  # noqa: E731
    return [i for i in sorted(range(2 ** bits), key=reverse) if i < n]


def ceiling(onnx_path, encodings, pad_id, thread_options, device, batch_sizes, seconds_per_size, progress):
    """onnxruntime in-process on the served model.onnx: best texts/s over a sweep of thread counts and batch sizes.

    For each batch size the sorted batches run in bit-reversed order (any prefix is spread evenly over the length
    range) until `seconds_per_size` pass or all ran once: a time-limited run is a stratified sample of the corpus."""
    results = []
    for threads in thread_options:
        session = _session(onnx_path, threads, device)
        results += _ceiling_sweep(session, threads, encodings, pad_id, batch_sizes, seconds_per_size, progress)
    return max(results, key=lambda r: r["texts_per_s"]), results


def _ceiling_sweep(session, threads, encodings, pad_id, batch_sizes, seconds_per_size, progress):
    results = []
    for batch_size in batch_sizes:
        batches = _batches(encodings, batch_size, pad_id)
        order = _spread(len(batches))
        for ids, mask, _ in batches[:1] + batches[-1:]:  # warm-up: smallest and largest shapes
            session.run(None, {"input_ids": ids, "attention_mask": mask})
        texts = tokens = computed = 0
        started = time.perf_counter()
        elapsed = 0.0
        for index in order:
            ids, mask, real = batches[index]
            session.run(None, {"input_ids": ids, "attention_mask": mask})
            texts += ids.shape[0]
            tokens += real
            computed += ids.size
            elapsed = time.perf_counter() - started
            if elapsed >= seconds_per_size:
                break
        result = {"batch_size": batch_size, "threads": threads, "texts_per_s": texts / elapsed,
                  "tokens_per_s": tokens / elapsed, "padding_efficiency": tokens / computed, "texts": texts,
                  "seconds": elapsed}
        progress(f"ceiling threads {threads or 'all'} batch {batch_size}: {result['texts_per_s']:.1f} texts/s, "
                 f"{result['tokens_per_s']:.0f} tokens/s")
        results.append(result)
    return results


def grouped_requests(onnx_path, encodings, pad_id, threads, device, per_request, plan, seconds):
    """onnxruntime in-process on requests of `per_request` texts in the load's order, each cut by `plan` (lengths ->
    [(rows, padded width)]: the tokenizer's cut for a BLS caller) and run group by group. What one request's own
    length groups allow without a server: the ceiling sorts the whole corpus, a server sees one request at a time."""
    session = _session(onnx_path, threads, device)
    requests = [encodings[i:i + per_request] for i in range(0, len(encodings) - per_request + 1, per_request)]

    def run(request):
        runs = tokens = computed = 0
        for rows, width in plan([len(e) for e in request]):
            ids, mask = _padded([request[row] for row in rows], width, pad_id)
            session.run(None, {"input_ids": ids, "attention_mask": mask})
            runs, tokens, computed = runs + 1, tokens + int(mask.sum()), computed + ids.size
        return runs, tokens, computed

    run(requests[0])  # warm-up
    texts = runs = tokens = computed = 0
    started = time.perf_counter()
    for request in requests:
        done = run(request)
        texts, runs, tokens, computed = texts + len(request), runs + done[0], tokens + done[1], computed + done[2]
        if time.perf_counter() - started >= seconds:
            break
    elapsed = time.perf_counter() - started
    return {"texts_per_s": texts / elapsed, "rows_per_run": texts / runs, "padding_efficiency": tokens / computed,
            "texts": texts, "seconds": elapsed, "threads": threads}


def client_tokenization_cost(tokenizer, texts, seconds=1.0):
    """Mean µs to tokenize one text on its own, as a client sending one text per request does."""
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for text in texts:
            tokenizer.encode(text)
            count += 1
    return (time.perf_counter() - started) / count * 1e6


async def _probe(url, model, texts, concurrency):
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    queue = list(enumerate(texts))
    results = [None] * len(texts)

    async def worker():
        while queue:
            index, text = queue.pop()
            tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=np.object_))
            # `embedding` must be asked for too: an ensemble skips steps whose outputs nobody requested.
            outputs = [grpcclient.InferRequestedOutput(name) for name in ("embedding", "num_tokens", "attention_mask")]
            response = await client.infer(model, [tensor], outputs=outputs)
            mask = response.as_numpy("attention_mask")
            results[index] = (int(response.as_numpy("num_tokens").reshape(-1)[0]), int(mask.shape[-1]))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return results


def padding_probe(url, model, texts, concurrency):
    """Send the texts at `concurrency` through a copy of the ensemble that also returns the padded attention mask.

    The encoder's dynamic batcher only merges requests of equal shape, so every row it computes is exactly as wide
    as the tokenizer padded it: computed tokens = sum of padded widths; real tokens = sum of num_tokens."""
    started = time.perf_counter()
    results = asyncio.run(_probe(url, model, texts, concurrency))
    real = sum(r[0] for r in results)
    computed = sum(r[1] for r in results)
    return {"texts": len(results), "real_tokens": real, "computed_tokens": computed,
            "padding_efficiency": real / computed if computed else 0.0, "seconds": time.perf_counter() - started}
