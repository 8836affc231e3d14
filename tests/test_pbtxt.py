"""exporter/pbtxt.py: config.pbtxt through Triton's own ModelConfig. Parse errors name the file; fields are
read and edited on the message (a copy, in the form given); what it writes Triton's schema reads back the same; it
needs protobuf and model_config_pb2 only, never grpc (bench/gpu.py's GPU machines lack it)."""
import os
import subprocess
import sys

import pytest

from conftest import PROJECT, pbtxt
from local_triton.settings import MODEL_SOURCE

TOKENIZER = os.path.join(MODEL_SOURCE, "tokenizer", "config.pbtxt")


def test_a_config_that_does_not_parse_names_its_file(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('backend: "python"\nmax_batch_size: lots\n')
    with pytest.raises(pbtxt.ConfigError, match=f"{path}: not a Triton model config: 2:"):
        pbtxt.read(str(path))
    with pytest.raises(pbtxt.ConfigError):
        pbtxt.parameter(str(path), "anything")
    assert pbtxt.parameter(str(tmp_path / "missing.pbtxt"), "anything", "default") == "default"


def test_fields_are_read_and_edited_on_a_copy_and_written_back(tmp_path):
    cpu = pbtxt.read(TOKENIZER)
    assert pbtxt.max_batch_size(cpu) == 256 and pbtxt.max_queue_size(cpu) == 512
    assert pbtxt.parameter(TOKENIZER, "pad_to_multiple_of") == pbtxt.parameters(cpu)["pad_to_multiple_of"]
    edited = pbtxt.with_parameters(pbtxt.with_max_queue_size(pbtxt.with_instance_count(cpu, 5), 9),
                                   {"pad_to_multiple_of": 64})
    assert (pbtxt.instance_count(edited), pbtxt.max_queue_size(edited)) == (5, 9)
    assert pbtxt.parameters(edited)["pad_to_multiple_of"] == "64"
    assert pbtxt.instance_count(cpu) != 5 and pbtxt.parameters(cpu)["pad_to_multiple_of"] != "64"  # a copy
    with pytest.raises(KeyError, match="no_such_parameter"):
        pbtxt.with_parameters(cpu, {"no_such_parameter": "1"})
    assert cpu.model_warmup and not pbtxt.without_warmup(cpu).model_warmup
    with_mask = pbtxt.with_output(cpu, "probe", "TYPE_INT64", [-1])
    assert with_mask.output[-1].name == "probe" and list(with_mask.output[-1].dims) == [-1]
    pbtxt.write(str(tmp_path / "config.pbtxt"), edited, "# a header\n")
    written = (tmp_path / "config.pbtxt").read_text()
    assert written.startswith("# a header\n") and pbtxt.parse(written) == edited
    text = open(TOKENIZER, encoding="utf-8").read()  # text in, text out
    assert isinstance(pbtxt.with_instance_count(text, 3), str)
    assert pbtxt.instance_count(pbtxt.with_instance_count(text, 3)) == 3


def test_no_queue_policy_or_instance_group_is_a_key_error_not_a_new_field():
    bare = pbtxt.parse('backend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n')
    assert pbtxt.instance_count(bare) is None and pbtxt.max_queue_size(bare) is None
    with pytest.raises(KeyError):
        pbtxt.with_instance_count(bare, 2)
    with pytest.raises(KeyError):
        pbtxt.with_max_queue_size(bare, 2)


def test_it_loads_without_grpc():
    """model_config_pb2 from its file, without tritonclient/grpc/__init__.py (which imports grpc); a later
    `import tritonclient.grpc` still gets the same module."""
    code = ("import sys; sys.modules['grpc'] = None\n"
            "from exporter import pbtxt\n"
            "assert pbtxt.read('model_source/tokenizer/config.pbtxt').max_batch_size == 256\n"
            "assert 'tritonclient.grpc' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], cwd=PROJECT, check=True)
    code = ("from exporter import pbtxt\n"
            "from tritonclient.grpc import model_config_pb2\n"
            "assert model_config_pb2 is pbtxt.model_config_pb2\n")
    subprocess.run([sys.executable, "-c", code], cwd=PROJECT, check=True)


def test_declared_tensors_and_ensemble_steps_are_read_from_the_message():
    config = pbtxt.parse('platform: "ensemble"\nmax_batch_size: 8\n'
                         'input [ { name: "text", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
                         'output [ { name: "vectors", data_type: TYPE_FP32, dims: [ -1, 32 ] } ]\n'
                         'ensemble_scheduling { step [\n'
                         '  { model_name: "a_tokenizer", model_version: -1, input_map { key: "text", value: "text" }\n'
                         '    output_map { key: "input_ids", value: "ids" } },\n'
                         '  { model_name: "a_embedding", model_version: -1,\n'
                         '    input_map { key: "input_ids", value: "ids" }\n'
                         '    output_map { key: "colbert", value: "vectors" } } ] }\n')
    assert pbtxt.declared(config) == [("text", "TYPE_STRING", "1"), ("vectors", "TYPE_FP32", "-1, 32")]
    assert pbtxt.step_models(config) == ["a_tokenizer", "a_embedding"]
    assert pbtxt.output_maps(config) == {"ids": "input_ids", "vectors": "colbert"}
