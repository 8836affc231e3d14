"""The `tokenizer` model called directly: same token ids as Hugging Face on the same files, truncation and padding
as documented in its config.pbtxt; unit tests of its length grouping (grouping.py, a pure function) and of its
tolerant BYTES deserializer."""
import os
import queue
import random
import shutil

import numpy as np
import pytest

from conftest import PROJECT, TINY_XLMR_MAX_LENGTH, pbtxt, start_server, stop_server
from model_library.in_process import model_module
from triton_clients import PROTOCOLS, TOKENIZER_OUTPUTS, VARIED_TEXTS, client, infer, outputs, text_input, url_for


def _served(name, request):
    """(server, HF tokenizer on the same files, max length, pad id, pad_to_multiple_of) for MiniLM or the XLM-R
    fixture tokenizer; pad_to_multiple_of as the served tokenizer's config says."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    if name == "minilm":
        server = request.getfixturevalue("server")
        hf, max_length, pad_id = AutoTokenizer.from_pretrained(request.getfixturevalue("minilm_model_dir")), 256, 0
    else:
        server = request.getfixturevalue("xlmr_server")
        hf, max_length, pad_id = request.getfixturevalue("xlmr_hf_tokenizer"), TINY_XLMR_MAX_LENGTH, 1
    connection = client("http", server.http_url)
    try:
        parameters = connection.get_model_config("tokenizer")["parameters"]
    finally:
        connection.close()
    assert parameters["max_length"]["string_value"] == ""  # the exported one, from tokenizer.json:
    exported = Tokenizer.from_file(os.path.join(server.repository, "tokenizer", "1", "tokenizer.json"))
    assert exported.truncation["max_length"] == max_length
    return server, hf, max_length, pad_id, int(parameters["pad_to_multiple_of"]["string_value"])


@pytest.fixture(scope="module", params=["minilm", "xlmr"])
def served(request):
    return _served(request.param, request)


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def _check_row(result, row, expected_ids, pad_id, max_length, multiple):
    ids, mask = result["input_ids"][row], result["attention_mask"][row]
    n = int(result["num_tokens"].reshape(-1)[row])
    assert n == len(expected_ids) <= max_length
    assert ids[:n].tolist() == expected_ids
    assert (ids[n:] == pad_id).all(), "ids beyond num_tokens must be the pad id"
    assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
    assert ids.shape[0] % multiple == 0
    return n


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ids_match_hugging_face_one_text_per_request(served, protocol):
    server, hf, max_length, pad_id, multiple = served
    assert hf.pad_token_id == pad_id
    connection = client(protocol, url_for(server, protocol))
    try:
        for text in VARIED_TEXTS:
            expected = hf(text, truncation=True, max_length=max_length)["input_ids"]
            result = infer(protocol, None, [text], model="tokenizer", names=TOKENIZER_OUTPUTS,
                           connection=connection)
            assert result["input_ids"].dtype == np.int64 and result["attention_mask"].dtype == np.int64
            n = _check_row(result, 0, expected, pad_id, max_length, multiple)
            # Alone in its request, a text is padded only up to the next multiple of pad_to_multiple_of.
            assert result["input_ids"].shape == (1, _round_up(n, multiple)), text[:40]
            untruncated = len(hf(text)["input_ids"])
            assert bool(result["truncated"].reshape(-1)[0]) == (untruncated > max_length), text[:40]
    finally:
        connection.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ids_match_hugging_face_many_rows(served, protocol):
    """Rows of one request share one width: the longest row rounded up to pad_to_multiple_of."""
    server, hf, max_length, pad_id, multiple = served
    texts = VARIED_TEXTS[:30]
    result = infer(protocol, url_for(server, protocol), texts, model="tokenizer", names=TOKENIZER_OUTPUTS)
    expected = hf(texts, truncation=True, max_length=max_length)["input_ids"]
    lengths = [_check_row(result, row, ids, pad_id, max_length, multiple) for row, ids in enumerate(expected)]
    assert result["input_ids"].shape == (len(texts), _round_up(max(lengths), multiple))
    assert result["num_tokens"].shape == result["truncated"].shape == (len(texts), 1)


def test_ids_match_hugging_face_concurrent_requests(served):
    """Concurrent requests are tokenized in one execute and padded per length group: each response still has
    HF's ids, pad ids and a zero mask beyond num_tokens, and a width that is a multiple of pad_to_multiple_of."""
    server, hf, max_length, pad_id, multiple = served
    texts = VARIED_TEXTS[:48]
    connection = client("grpc", server.grpc_url)
    done = queue.Queue()
    try:
        for i, text in enumerate(texts):
            connection.async_infer("tokenizer", [text_input("grpc", [text])],
                                   callback=lambda result, error, i=i: done.put((i, result, error)),
                                   outputs=outputs("grpc", TOKENIZER_OUTPUTS))
        results = {}
        for _ in texts:
            i, result, error = done.get(timeout=60)
            assert error is None, error
            results[i] = {name: result.as_numpy(name) for name in TOKENIZER_OUTPUTS}
    finally:
        connection.close()
    for i, text in enumerate(texts):
        n = _check_row(results[i], 0, hf(text, truncation=True, max_length=max_length)["input_ids"], pad_id,
                       max_length, multiple)
        assert results[i]["input_ids"].shape[1] >= _round_up(n, multiple)


def test_length_groups_for_a_caller_that_runs_them(server):
    """Asked for `length_group` (the BLS model asks), one request comes back padded to its longest row, and each
    row is told its group: grouping.plan_groups over the rows' lengths with split_overhead_tokens (one request's
    groups run as their own encoder requests, back to back: each costs only its hop, not batch_overhead_tokens)."""
    connection = client("http", server.http_url)
    try:
        parameters = {k: v["string_value"] for k, v in connection.get_model_config("tokenizer")["parameters"].items()}
    finally:
        connection.close()
    texts = [VARIED_TEXTS[i % len(VARIED_TEXTS)] * (1 + i % 5) for i in range(32)]
    result = infer("grpc", server.grpc_url, texts, model="tokenizer", names=[*TOKENIZER_OUTPUTS, "length_group"])
    lengths = result["num_tokens"].reshape(-1).tolist()
    multiple = int(parameters["pad_to_multiple_of"])
    assert result["input_ids"].shape == (32, _round_up(max(lengths), multiple))
    plan = plan_groups([[n] for n in lengths], multiple, float(parameters["split_overhead_tokens"]),
                       float(parameters["min_padding_efficiency"]), int(parameters["max_batch_tokens"]))
    assert len(plan) > 1  # texts of 5 lengths: one run padded to the longest would not be the cheapest
    for index, (rows, width) in enumerate(plan):
        assert result["length_group"][rows].tolist() == [[index, width]] * len(rows)


def test_truncation_at_exactly_max_length(served):
    """A text longer than max_length gives exactly max_length tokens, num_tokens == max_length, truncated true,
    and the ids Hugging Face gives with truncation=True; a text of exactly max_length tokens is not truncated."""
    server, hf, max_length, pad_id, multiple = served
    special = len(hf("")["input_ids"])  # [CLS] [SEP] / <s> </s>
    word = next(w for w in ("hello", "the", "world", "a") if len(hf(w)["input_ids"]) == special + 1)
    fits = " ".join([word] * (max_length - special))
    over = " ".join([word] * (max_length - special + 1))
    very_long = "Paris is the capital of France. " * 200
    assert len(hf(fits)["input_ids"]) == max_length and len(hf(over)["input_ids"]) == max_length + 1
    for protocol in PROTOCOLS:
        result = infer(protocol, url_for(server, protocol), [fits, over, very_long], model="tokenizer",
                       names=TOKENIZER_OUTPUTS)
        np.testing.assert_array_equal(result["num_tokens"].reshape(-1), [max_length] * 3)
        np.testing.assert_array_equal(result["truncated"].reshape(-1), [False, True, True])
        assert result["input_ids"].shape == (3, _round_up(max_length, multiple))
        for row, text in enumerate([fits, over, very_long]):
            _check_row(result, row, hf(text, truncation=True, max_length=max_length)["input_ids"], pad_id,
                       max_length, multiple)
        # the truncated sequence still ends with the closing special token, like Hugging Face's
        assert result["input_ids"][1, max_length - 1] == hf.sep_token_id


def _power_of_two_width(tokens, multiple, max_width):
    """The widths config.pbtxt documents for pad_to_power_of_two: the next power of two, then the multiple, at most
    max_length padded to the multiple."""
    width = 1
    while width < tokens:
        width *= 2
    return min(_round_up(width, multiple), max_width)


@pytest.mark.serving  # its own server: the model code runs again on Python 3.10
def test_power_of_two_widths_through_the_server(minilm_repository, minilm_model_dir, tmp_path):
    """pad_to_power_of_two true (the GPU configs' setting, GPU_TOKENIZER) served by tritonserver: a text alone pads to
    the next power of two (8 tokens -> 8, 9 -> 16, 65 -> 128), never wider than max_length padded (here 200: a
    132-token text pads to 200, not 256); a request's rows share its longest row's width; the length groups a
    caller runs get such widths; the ids stay Hugging Face's. Few widths let the encoder's batcher join single
    texts: on an H100, single passages ran 27 rows per encoder run instead of 2 (docs/benchmarks-gpu.md, run 8)."""
    from transformers import AutoTokenizer

    repository = tmp_path / "repository"
    shutil.copytree(os.path.join(minilm_repository, "tokenizer"), repository / "tokenizer")
    config = repository / "tokenizer" / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    text = pbtxt.with_parameters(text, {"pad_to_power_of_two": "true", "max_length": "200"})
    config.write_text(text, encoding="utf-8")
    multiple = int(pbtxt.parameters(text)["pad_to_multiple_of"])
    hf, max_length = AutoTokenizer.from_pretrained(minilm_model_dir), 200
    running = start_server(repository, str(tmp_path), extra_env={"LOAD_MODELS": "tokenizer"})
    try:
        connection = client("grpc", running.grpc_url)
        try:
            widths = {}
            for words in (1, 6, 7, 60, 63, 120, 130, 300):  # MiniLM: words + 2 tokens
                text = "hello " * words
                expected = hf(text, truncation=True, max_length=max_length)["input_ids"]
                result = infer("grpc", None, [text], model="tokenizer", names=TOKENIZER_OUTPUTS,
                               connection=connection)
                n = _check_row(result, 0, expected, 0, max_length, 1)
                widths[n] = result["input_ids"].shape[1]
                assert widths[n] == _power_of_two_width(n, multiple, 200), (n, widths[n])
            assert widths == {3: 8, 8: 8, 9: 16, 62: 64, 65: 128, 122: 128, 132: 200, 200: 200}
            texts = ["hello " * 7, "hello " * 60, "hello " * 2]
            result = infer("grpc", None, texts, model="tokenizer", names=TOKENIZER_OUTPUTS, connection=connection)
            assert result["input_ids"].shape == (3, 64)
            result = infer("grpc", None, ["hello " * 7, "hello " * 120, "hello " * 6], model="tokenizer",
                           names=[*TOKENIZER_OUTPUTS, "length_group"], connection=connection)
            lengths = result["num_tokens"].reshape(-1).tolist()
            assert result["input_ids"].shape == (3, 128)
            for n, (_, width) in zip(lengths, result["length_group"].tolist()):
                assert width >= _power_of_two_width(n, multiple, 200) and width in (8, 16, 128), (n, width)
        finally:
            connection.close()
    finally:
        stop_server(running)


def test_xlmr_tokenizer_is_the_real_250k_vocabulary(xlmr_server, xlmr_hf_tokenizer):
    hf = xlmr_hf_tokenizer
    assert len(hf) == 250002
    result = infer("grpc", xlmr_server.grpc_url, ["Hello world"], model="tokenizer", names=TOKENIZER_OUTPUTS)
    assert result["input_ids"][0, :4].tolist() == [0, 35378, 8999, 2]  # the fixture README's check


# ---------------------------------------------------------------- unit tests of the length grouping
grouping = model_module("tokenizer", "grouping")
pad_width, plan_groups = grouping.pad_width, grouping.plan_groups

UNLIMITED = 10 ** 9


def _cost(groups, lengths, overhead):
    return sum(overhead + sum(len(lengths[i]) for i in group) * width for group, width in groups)


def _best_cost(lengths, multiple, min_efficiency, overhead):
    """Brute force over every contiguous split of the longest-first order (small inputs only)."""
    order = sorted(range(len(lengths)), key=lambda i: max(lengths[i]), reverse=True)
    best = float("inf")
    for mask in range(2 ** max(0, len(order) - 1)):
        groups, current = [], [order[0]]
        for k, i in enumerate(order[1:]):
            if mask >> k & 1:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
        split = []
        for group in groups:
            width = -(-max(lengths[group[0]]) // multiple) * multiple
            real = sum(sum(lengths[i]) for i in group)
            if len({-(-max(lengths[i]) // multiple) for i in group}) > 1 and \
                    real < min_efficiency * sum(len(lengths[i]) for i in group) * width:
                break
            split.append((group, width))
        else:
            best = min(best, _cost(split, lengths, overhead))
    return best


def _check_groups(lengths, groups, multiple, min_efficiency, max_tokens=UNLIMITED):
    seen = [i for group, _ in groups for i in group]
    assert sorted(seen) == list(range(len(lengths))), "every request appears exactly once"
    widths = [width for _, width in groups]
    assert widths == sorted(widths, reverse=True), "longest first, so equal widths are sent back to back"
    for group, width in groups:
        longest = max(max(lengths[i]) for i in group)
        assert width % multiple == 0 and longest <= width < longest + multiple
        rows = sum(len(lengths[i]) for i in group)
        assert rows * width <= max_tokens or len(group) == 1, "no group over the token budget"
        if len({-(-max(lengths[i]) // multiple) for i in group}) > 1:
            real = sum(sum(lengths[i]) for i in group)
            assert real / (rows * width) >= min_efficiency, (group, width)


def _random_lengths(rng, requests):
    lengths = []
    for _ in range(requests):  # per request, the lengths of its rows
        rows = rng.choice([1, 1, 1, 2, 5])
        scale = rng.choice([8, 64, 512])
        lengths.append([rng.randint(2, scale) for _ in range(rows)])
    return lengths


def test_long_texts_share_a_run_only_within_attention_memory():
    """Issue 71: attention's memory grows with rows x width^2 (one 8,192-token text took bge-m3's encoder to
    11 GiB). With max_batch_tokens 16,384, two texts of 8,192 tokens fit the token budget but not one run's attention
    (max_batch_tokens x ATTENTION_WIDTH): each runs alone; texts up to ATTENTION_WIDTH wide group by tokens alone."""
    budget = 16384
    assert grouping.fits(1, 32768, budget)  # a lone row always runs
    assert not grouping.fits(2, 8192, budget) and grouping.fits(2, 5792, budget) and not grouping.fits(2, 5800, budget)
    assert grouping.fits(4, 4096, budget) and grouping.fits(64, 256, budget)  # the token budget's own limits
    groups = plan_groups([[8192], [8192], [4096], [4096]], 8, 256, 0.5, budget)
    assert sorted(len(group) for group, _ in groups) == [1, 1, 2]
    for group, width in groups:
        assert grouping.fits(len(group), width, budget)
    split = plan_groups([[8000]] * 3, 8, 0, 0.0, budget)  # no overhead: one group would be cheapest, were it allowed
    assert [len(group) for group, _ in split] == [1, 1, 1]


def test_a_request_of_long_texts_over_one_runs_attention_is_refused_naming_the_bound():
    """Issue 71, the tokenizer's per-request check (a request the ensemble sends to the encoder as one run): two texts
    of 8,192 tokens fit max_batch_tokens (16,384) but not one run's attention memory: refused as too long, naming
    the bound, before the encoder runs; one such text, or two of 4,096, pass. (Through tritonserver a long-context
    export is needed: bench/full_size.py's is bge-m3's.)"""
    from types import SimpleNamespace

    from conftest import import_python_model

    class TritonError(Exception):  # what the model's module reads of pb_utils at import
        INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = 3, 14, 13, 1

    tokenizer = import_python_model("tokenizer", TritonModelException=RuntimeError, TritonError=TritonError,
                                    TRITONSERVER_RESPONSE_COMPLETE_FINAL=1)
    model = object.__new__(tokenizer.TritonPythonModel)
    model.multiple, model.power_of_two, model.max_width, model.max_batch_tokens = 8, False, 8192, 16384

    def rows(*lengths):
        return [SimpleNamespace(ids=[0] * n) for n in lengths]
    model.check(rows(8192), split=False)
    model.check(rows(4096, 4096), split=False)
    model.check(rows(8192, 8192), split=True)  # its caller runs the length groups apart
    with pytest.raises(ValueError) as refused:
        model.check(rows(8192, 8000), split=False)
    assert refused.value.field == "text" and refused.value.kind == "too_long", vars(refused.value)
    assert "2 texts of 8192 tokens" in str(refused.value) and "at most 1 that long" in str(refused.value)
    assert "max_batch_tokens 16384 x 4096 token pairs" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("seed", range(40))
def test_groups_properties_random(seed):
    """Every request exactly once; widths cover their rows, rounded to the multiple, longest first; a group of
    several widths keeps real/padded >= min_padding_efficiency; no group over max_batch_tokens."""
    rng = random.Random(seed)
    multiple = rng.choice([1, 8, 16, 64])
    min_efficiency = rng.choice([0.0, 0.5, 0.75, 0.9, 1.0])
    max_tokens = rng.choice([UNLIMITED, 4096, 1024])
    lengths = _random_lengths(rng, rng.randint(1, 64))
    lengths = [rows for rows in lengths if len(rows) * -(-max(rows) // multiple) * multiple <= max_tokens]
    groups = plan_groups(lengths, multiple, 256, min_efficiency, max_tokens)
    _check_groups(lengths, groups, multiple, min_efficiency, max_tokens)


@pytest.mark.parametrize("seed", range(20))
def test_groups_minimize_documented_cost(seed):
    """config.pbtxt: groups minimize sum(batch_overhead_tokens + rows x padded width) under the efficiency floor
    (checked against brute force over all contiguous splits of the longest-first order)."""
    rng = random.Random(1000 + seed)
    multiple, min_efficiency = rng.choice([1, 8, 16]), rng.choice([0.0, 0.5, 0.75])
    overhead = rng.choice([0, 16, 256, 4096])
    lengths = _random_lengths(rng, rng.randint(1, 9))
    groups = plan_groups(lengths, multiple, overhead, min_efficiency, UNLIMITED)
    _check_groups(lengths, groups, multiple, min_efficiency)
    assert _cost(groups, lengths, overhead) == _best_cost(lengths, multiple, min_efficiency, overhead)


def test_groups_examples():
    assert plan_groups([], 16, 256, 0.75) == []
    assert plan_groups([[5]], 16, 256, 0.75) == [([0], 16)]
    # similar lengths share one group; a far shorter one gets its own
    groups = plan_groups([[100], [98], [10], [97]], 16, 256, 0.75)
    assert [sorted(g) for g, _ in groups] == [[0, 1, 3], [2]] and [w for _, w in groups] == [112, 16]
    # with no efficiency floor and a costly encoder run, everything is one group padded to the longest
    assert [(sorted(g), w) for g, w in plan_groups([[3], [40, 7]], 16, 256, 0.0)] == [([0, 1], 48)]
    # with free encoder runs, no padding beyond the rounding is worth paying
    lengths = [[3], [40], [39], [17]]
    groups = plan_groups(lengths, 8, 0, 0.0)
    assert {w for _, w in groups} == {8, 24, 40} and _cost(groups, lengths, 0) == 8 + 24 + 40 + 40
    # the token budget splits equal widths: 300 one-row requests of 16 tokens, 1024 tokens per group
    groups = plan_groups([[16]] * 300, 8, 256, 0.5, max_tokens=1024)
    assert [len(g) for g, _ in groups] == [64, 64, 64, 64, 44] and {w for _, w in groups} == {16}


@pytest.mark.parametrize("multiple", [1, 8, 32])
def test_pad_width_power_of_two(multiple):
    """Every length gets the documented width; off, the plain multiple."""
    for tokens in range(1, 1100):
        assert pad_width(tokens, multiple) == _round_up(tokens, multiple)
        assert pad_width(tokens, multiple, True, 1024) == _power_of_two_width(tokens, multiple, 1024)
        assert pad_width(tokens, multiple, True) == _power_of_two_width(tokens, multiple, 10 ** 9)


def test_power_of_two_groups_fewer_widths():
    """With powers of two, the groups' widths come from pad_width, and a GPU's cost model (run overhead 4096, no
    floor) puts single passages of 100-500 tokens of one execute into one group; every group still within
    max_tokens."""
    rng = random.Random(3)
    lengths = [[rng.randint(100, 500)] for _ in range(40)]
    groups = plan_groups(lengths, 32, 4096, 0.0, 16384, power_of_two=True, max_width=8192)
    assert {w for _, w in groups} <= {128, 256, 512}
    for requests, width in groups:
        assert len(requests) * width <= 16384
        assert all(pad_width(max(lengths[i]), 32, True, 8192) <= width for i in requests)
    assert sorted(i for g, _ in groups for i in g) == list(range(40))
    assert len(groups) == -(-40 * 512 // 16384)  # the fewest runs the budget allows


def test_gpu_grouping_keeps_a_requests_mixed_texts_in_one_run():
    """The BLS model's split of one request (split_overhead_tokens, min_padding_efficiency): the CPU's values cut
    16 queries and 16 passages into several encoder runs (cheaper where a run costs its padded tokens), the GPU
    configs' (GPU_TOKENIZER) keep them in one, which took ensemble_bls from 285-323 to 1,425-1,875 texts/s on an
    H100 (docs/benchmarks-gpu.md, runs 4-6)."""
    from exporter import pbtxt
    from exporter.repository import GPU_TOKENIZER

    rng = random.Random(7)
    lengths = [[rng.randint(5, 20)] for _ in range(16)] + [[rng.randint(100, 250)] for _ in range(16)]
    rng.shuffle(lengths)

    def runs(parameters):
        return len(plan_groups(lengths, int(parameters["pad_to_multiple_of"]),
                               float(parameters["split_overhead_tokens"]),
                               float(parameters["min_padding_efficiency"]), 16384))

    with open(os.path.join(PROJECT, "model_source", "tokenizer", "config.pbtxt"), encoding="utf-8") as handle:
        cpu = pbtxt.parameters(handle.read())
    assert runs(cpu) > 2
    assert runs(GPU_TOKENIZER) == 1


# ---------------------------------------------------------------- the tokenizer's other tasks: tokenize and decode
def _tokenize_inputs(protocol, texts, ids=None):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    if ids is None:
        return [text_input(protocol, texts)]
    tensor = (httpclient if protocol == "http" else grpcclient).InferInput("token_ids", list(ids.shape), "INT64")
    tensor.set_data_from_numpy(ids)
    return [tensor]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tokenize_and_decode_tasks_over_kserve(served, protocol):
    """Asked for `token_text`, the tokenizer lists every token, not truncated, with its special flag and bytes;
    given `token_ids` (-1 pads a row), it decodes them as Hugging Face does. An id outside the vocabulary is that
    row's 400, and the model serves on."""
    server, hf, max_length, _, _ = served
    texts = [VARIED_TEXTS[0], "Größe — 東京 " * 80]  # the second passes max_length
    connection = client(protocol, url_for(server, protocol))
    try:
        names = ("input_ids", "token_text", "token_special", "byte_offsets", "num_tokens", "truncated")
        result = connection.infer("tokenizer", _tokenize_inputs(protocol, texts), outputs=outputs(protocol, names))
        for row, text in enumerate(texts):
            expected = hf(text, return_offsets_mapping=True, return_special_tokens_mask=True)
            n = int(result.as_numpy("num_tokens")[row, 0])
            assert result.as_numpy("input_ids")[row, :n].tolist() == expected["input_ids"]
            assert (result.as_numpy("input_ids")[row, n:] == -1).all()
            assert result.as_numpy("token_special")[row, :n].tolist() == [bool(m) for m in
                                                                          expected["special_tokens_mask"]]
            data, spans = text.encode(), result.as_numpy("byte_offsets")[row]
            for k, ((start, stop), special) in enumerate(zip(expected["offset_mapping"],
                                                             expected["special_tokens_mask"])):
                if not special:
                    assert spans[k].tolist() == [len(text[:start].encode()), len(text[:stop].encode())]
                    assert result.as_numpy("token_text")[row, k] == data[spans[k, 0]:spans[k, 1]]
        assert int(result.as_numpy("num_tokens")[1, 0]) > max_length
        assert not result.as_numpy("truncated").any()

        rows = [hf(text)["input_ids"] for text in texts]
        ids = np.full((2, max(map(len, rows))), -1, dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        decoded = connection.infer("tokenizer", _tokenize_inputs(protocol, None, ids),
                                   outputs=outputs(protocol, ["decoded"])).as_numpy("decoded").reshape(-1)
        assert [d.decode() for d in decoded] == [hf.decode(row, skip_special_tokens=True) for row in rows]
        ids[1, 0] = 10**9
        with pytest.raises(Exception, match=r"token_ids\[1\] holds 1000000000, not a token id"):
            connection.infer("tokenizer", _tokenize_inputs(protocol, None, ids), outputs=outputs(protocol, ["decoded"]))
        again = infer(protocol, None, texts[:1], model="tokenizer", names=TOKENIZER_OUTPUTS, connection=connection)
        assert again["input_ids"][0, :int(again["num_tokens"][0, 0])].tolist() == rows[0]
        # a request naming no outputs is given all of them: still the embedding task (truncated, with a mask)
        every = connection.infer("tokenizer", _tokenize_inputs(protocol, texts[1:]))
        assert every.as_numpy("attention_mask") is not None and every.as_numpy("token_text") is None
        assert int(every.as_numpy("num_tokens")[0, 0]) == max_length and every.as_numpy("truncated")[0, 0]
    finally:
        connection.close()


def test_a_routers_task_and_the_query_lookup(tmp_path, minilm_model_dir):
    """Inference-free SPLADE's side rule (request_rules.task: prompt_name names a route, input_type stands for one;
    neither, or another prompt: the default route) and its query side (query_lookup.py): the query's own tokens, no
    special ones, each distinct id once with its non-zero weight, by weight, -1 / 0 past the count."""
    import json

    from tokenizers import Tokenizer

    from model_library import query_lookup, request_rules

    routes = ("query", "document")
    for name, kind, task in ((None, "query", "query"), (None, "search_query", "query"), (None, "passage", "document"),
                             ("query", None, "query"), ("document", None, "document"), ("Retrieval", None, None),
                             (None, "classification", None), (None, None, None)):
        assert request_rules.task(routes, name, kind) == task, (name, kind)
        assert request_rules.task((), name, kind) is None
    assert request_rules.prompt({}, None, "query", None, ValueError, routes) is None  # a route, not a prompt
    with pytest.raises(ValueError):
        request_rules.prompt({}, None, "query", None, ValueError)

    tokenizer = Tokenizer.from_file(os.path.join(minilm_model_dir, "tokenizer.json"))
    tokenizer.save(str(tmp_path / query_lookup.TOKENIZER_FILE))
    weights = np.zeros(tokenizer.get_vocab_size(), dtype=np.float32)
    hello, world = tokenizer.token_to_id("hello"), tokenizer.token_to_id("world")
    weights[hello], weights[world] = 1.5, 2.5
    np.save(tmp_path / query_lookup.WEIGHTS_FILE, weights)
    (tmp_path / query_lookup.SIDE_FILE).write_text(json.dumps(
        {"routes": {"query": "lookup", "document": "encoder"}, "default_route": "document", "max_length": 4}))
    lookup = query_lookup.QueryLookup.load(str(tmp_path))
    assert lookup.looks_up("query") and not lookup.looks_up(None) and not lookup.looks_up("document")
    encodings = lookup.encode(["hello world hello", "nothing weighs", "a b c d e f"])
    assert encodings[0].ids == [hello, world, hello] and len(encodings[2].ids) == 4
    assert bool(encodings[2].overflowing) and not encodings[0].overflowing  # cut at max_length
    indices, values, counts = lookup.sparse([e.ids for e in encodings])
    assert indices.tolist() == [[world, hello], [-1, -1], [-1, -1]] and counts[:, 0].tolist() == [2, 0, 0]
    assert values.tolist() == [[2.5, 1.5], [0, 0], [0, 0]]
    assert query_lookup.QueryLookup.load(str(tmp_path / "none")) is None
