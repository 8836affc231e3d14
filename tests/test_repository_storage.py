"""The exported repository as storage serves it (issue 12): a read-only copy, under a path with any name (KServe
copies it to /mnt/models), loads and serves through the real tritonserver, and nothing writes into it. Also the
GPU variants export writes for Triton's --model-config-name parse as model configurations."""
import glob
import os
import shutil
import stat

import numpy as np
import pytest

from conftest import start_server, stop_server, wait_for_proxy
from local_triton import launch
from local_triton.settings import MODEL_SOURCE
from triton_clients import infer


def listing(folder):
    return {p: (os.path.getsize(p), os.path.getmtime(p)) for p in glob.glob(os.path.join(folder, "**"), recursive=True)}


@pytest.fixture(scope="module")
def read_only_server(minilm_repository, tmp_path_factory):
    mount = tmp_path_factory.mktemp("storage") / "mnt-models.read_only"  # a name of the user's choosing
    shutil.copytree(minilm_repository, mount, ignore=shutil.ignore_patterns("__pycache__"))
    for path in glob.glob(os.path.join(mount, "**"), recursive=True) + [str(mount)]:
        mode = os.stat(path).st_mode
        os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = listing(mount)
    running = start_server(mount, tmp_path_factory.mktemp("read_only_server"))
    wait_for_proxy(running)
    yield running, mount, before
    stop_server(running)
    for path in glob.glob(os.path.join(mount, "**"), recursive=True) + [str(mount)]:
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)


def test_read_only_repository_serves_and_stays_untouched(read_only_server, minilm_repository):
    import httpx

    running, mount, before = read_only_server
    assert not os.access(mount, os.W_OK) or os.geteuid() == 0  # root ignores the bits: the listing below decides
    texts = ["served from read-only storage", "a second text"]
    expected = infer("grpc", running.grpc_url, texts)["embedding"]
    assert expected.shape == (2, 384) and np.allclose(np.linalg.norm(expected, axis=1), 1.0, atol=1e-5)
    response = httpx.post(running.proxy_url + "/v1/embeddings", json={"input": texts}, timeout=60)
    assert response.status_code == 200
    np.testing.assert_allclose(np.array([d["embedding"] for d in response.json()["data"]]), expected, atol=1e-6)
    # The one write anything attempts: CPython caching the bytecode of each stub's model.py, which the stub imports
    # before any of our code runs (its embedded interpreter ignores PYTHONDONTWRITEBYTECODE). On a read-only mount
    # or as a non-root user CPython skips it silently; as root here it lands. Everything else stays as it was.
    changed = (set(listing(mount)) ^ set(before)) | {p for p in before if listing(mount).get(p) != before[p]}
    unexpected = {p for p in changed if not p.endswith(("/1/__pycache__", "/1"))
                  and not (os.path.basename(p).startswith("model.cpython-") and p.endswith(".pyc"))}
    assert not unexpected, f"something wrote into the served repository: {sorted(unexpected)}"


def test_a_repository_path_triton_cannot_serve_is_refused_clearly(minilm_repository, tmp_path):
    """Triton's Python backend starts stubs through `bash -c` with the path unquoted: the launcher refuses such a
    path up front instead of letting every Python model fail with a bash syntax error."""
    odd = tmp_path / "models (copy)"
    shutil.copytree(minilm_repository, odd)
    with pytest.raises(SystemExit) as refused:
        launch.server_command(odd)
    assert "spaces or shell characters" in str(refused.value) and "models (copy)" in str(refused.value)


def parse(path):
    """A config.pbtxt as Triton's ModelConfig."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    with open(path, encoding="utf-8") as handle:
        return text_format.Parse(handle.read(), model_config_pb2.ModelConfig())


def test_gpu_variants_parse_as_model_configs(minilm_repository):
    """configs/gpu.pbtxt and configs/gpu-trt.pbtxt (for --model-config-name) are valid ModelConfig text, pin the
    instance to the GPU, drop the rate limiter, and keep the exported outputs. None has a queue policy: in Triton
    24.07 one turns off the batcher's prefetching, which left the encoder idle with requests queued (reference.md)."""
    from tritonclient.grpc import model_config_pb2

    cpu = parse(os.path.join(minilm_repository, "embedding", "config.pbtxt"))
    assert cpu.HasField("dynamic_batching") and not cpu.dynamic_batching.HasField("default_queue_policy")
    for variant in ("gpu", "gpu-trt"):
        config = parse(os.path.join(minilm_repository, "embedding", "configs", f"{variant}.pbtxt"))
        assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
        assert not config.instance_group[0].HasField("rate_limiter")
        assert [o.name for o in config.output] == [o.name for o in cpu.output]
        assert config.parameters["max_batch_tokens"].string_value == cpu.parameters["max_batch_tokens"].string_value
        # Their templates repeat config.pbtxt.template (a custom configuration replaces it whole): shared parts agree.
        for field in ("backend", "input", "output", "dynamic_batching", "model_warmup"):
            assert getattr(config, field) == getattr(cpu, field), (variant, field)
        assert variant == "gpu-trt" or config.max_batch_size == cpu.max_batch_size
    trt = parse(os.path.join(minilm_repository, "embedding", "configs", "gpu-trt.pbtxt"))
    accelerator = trt.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    rows, length = (int(n) for n in accelerator.parameters["trt_profile_max_shapes"].split(",")[0]
                    .split(":")[1].split("x"))
    assert rows == trt.max_batch_size and length == 256  # MiniLM's max length; rows x length = the token budget
    assert rows * length <= int(trt.parameters["max_batch_tokens"].string_value)


def test_tokenizer_gpu_variants_group_lengths_coarser(minilm_repository):
    """tokenizer/configs/{gpu,gpu-trt}.pbtxt (loaded with the encoder's under --model-config-name) are the tokenizer's
    config.pbtxt with coarser length groups (docs/benchmarks-gpu.md: runs of 3 rows -> 222 on an H100; one request's
    32 mixed texts in 1 run instead of ~6) and the GPU table's instance count and queue bound, and nothing else
    changed."""
    from exporter.repository import GPU, GPU_TOKENIZER

    cpu = parse(os.path.join(minilm_repository, "tokenizer", "config.pbtxt"))
    assert set(GPU_TOKENIZER) == {"pad_to_multiple_of", "pad_to_power_of_two", "batch_overhead_tokens",
                                  "split_overhead_tokens", "min_padding_efficiency"}
    for variant in ("gpu", "gpu-trt"):
        config = parse(os.path.join(minilm_repository, "tokenizer", "configs", f"{variant}.pbtxt"))
        for key, value in GPU_TOKENIZER.items():
            assert config.parameters[key].string_value == value != cpu.parameters[key].string_value, (variant, key)
            config.parameters[key].string_value = cpu.parameters[key].string_value
        assert [g.count for g in config.instance_group] == [GPU["tokenizer"]["instances"]]
        assert config.dynamic_batching.default_queue_policy.max_queue_size == GPU["tokenizer"]["max_queue_size"]
        config.instance_group[0].count = cpu.instance_group[0].count
        config.dynamic_batching.default_queue_policy.max_queue_size = \
            cpu.dynamic_batching.default_queue_policy.max_queue_size
        assert config == cpu, variant


def test_rerank_gpu_variants_keep_256_texts_per_call(minilm_repository):
    """rerank/configs/{gpu,gpu-trt}.pbtxt: the CPU config's 32 texts per call (a 1-text request waits behind one
    call's encoder runs, issue 59) would cut a GPU's runs to 32 rows: the GPU variants keep 256, nothing else
    changed."""
    from exporter.repository import GPU

    cpu = parse(os.path.join(minilm_repository, "rerank", "config.pbtxt"))
    assert cpu.parameters["texts_per_call"].string_value == "32"
    for variant in ("gpu", "gpu-trt"):
        config = parse(os.path.join(minilm_repository, "rerank", "configs", f"{variant}.pbtxt"))
        assert config.parameters["texts_per_call"].string_value == GPU["rerank"]["parameters"]["texts_per_call"]
        config.parameters["texts_per_call"].string_value = "32"
        assert config == cpu, variant


def test_the_gpu_configs_hold_the_gpu_tables_values_whatever_the_cpu_config_says(tmp_path):
    """Issue 51: the CPU tokenizer's second instance (a CPU fix) reached the GPU config and halved passages on an
    H200. The GPU configs take instance counts, queue bound and grouping from the GPU table alone: a CPU config with
    other values changes none of them."""
    from exporter import pbtxt, repository

    cpu = pbtxt.read(os.path.join(MODEL_SOURCE, "tokenizer", "config.pbtxt"))
    other = pbtxt.with_max_queue_size(pbtxt.with_instance_count(cpu, 3), 7)
    other = pbtxt.with_parameters(other, dict.fromkeys(repository.GPU_TOKENIZER, "3"))
    assert pbtxt.instance_count(other) == 3 and pbtxt.max_queue_size(other) == 7
    for text in (cpu, other):
        gpu = repository.gpu_tokenizer_config(text)
        assert pbtxt.instance_count(gpu) == repository.GPU["tokenizer"]["instances"] == 1
        assert pbtxt.max_queue_size(gpu) == repository.GPU["tokenizer"]["max_queue_size"]
        assert {k: v for k, v in pbtxt.parameters(gpu).items() if k in repository.GPU_TOKENIZER} == \
            repository.GPU_TOKENIZER
        assert pbtxt.parameters(gpu)["max_batch_tokens"] == pbtxt.parameters(text)["max_batch_tokens"]
    values = {"outputs": '  { name: "embedding", data_type: TYPE_FP32, dims: [ 8 ] }', "short_tokens": 4,
              "long_tokens": 16, "max_batch_tokens": 16384}
    repository.write_gpu_configs(str(tmp_path), values, 512, 16384)
    for variant in ("gpu", "gpu-trt"):
        config = pbtxt.read(os.path.join(tmp_path, "configs", f"{variant}.pbtxt"))
        assert pbtxt.instance_count(config) == repository.GPU["encoder"]["instances"], variant


def test_the_export_digest_covers_the_tokenizers_gpu_grouping(monkeypatch):
    """A repository exported with other GPU_TOKENIZER values is exported again by `make serve` (--skip-if-exported
    compares this digest), so new GPU configs reach it."""
    from exporter import repository

    before = repository.templates_digest()
    assert repository.templates_digest() == before
    monkeypatch.setitem(repository.GPU_TOKENIZER, "pad_to_multiple_of", "64")
    assert repository.templates_digest() != before
