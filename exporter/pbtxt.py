"""Triton's config.pbtxt through Triton's own schema, for the tools beside the serving code (export, bench, tests):
text parsed into `inference.ModelConfig` (model_config.proto, as tritonclient==2.48.0 ships it generated:
tritonclient/grpc/model_config_pb2.py), fields read and edited on the message, the message written back as text
with google.protobuf's text_format (the format Triton itself parses).

A `config` argument is a ModelConfig or its text; the with_* functions edit a copy and return it in the form they
were given (text in, text out). Text that does not parse raises ConfigError naming its file. Written text has no
comments (text_format keeps none): export renders configs from the templates, comments and all, and edits through
here only the ones it must (the tokenizer's GPU configs).

model_config_pb2 is loaded from its file without running tritonclient/grpc/__init__.py, which imports grpc: a
machine with protobuf and that one file can use this module (bench/gpu.py's GPU machines, docs/benchmarks-gpu.md).
Serving code never imports this: each model gets its config from Triton as JSON (args["model_config"]); the
launcher, which runs in the tritonserver image (no protobuf there), reads the proxy's two ports itself
(local_triton/ports.py)."""
import copy
import importlib.util
import os
import sys

from google.protobuf import text_format

PB2 = "tritonclient.grpc.model_config_pb2"


def _load_pb2():
    """tritonclient's model_config_pb2, from its file (sys.modules under its own name, so a later
    `import tritonclient.grpc` finds this one): tritonclient installed, or only tritonclient/grpc/model_config_pb2.py
    on the path (then `tritonclient` is a namespace package)."""
    if PB2 in sys.modules:
        return sys.modules[PB2]
    spec = importlib.util.find_spec("tritonclient")  # finds the package without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "grpc", "model_config_pb2.py")
        if os.path.isfile(path):
            module_spec = importlib.util.spec_from_file_location(PB2, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[PB2] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[PB2]
                raise
            return module
    raise ImportError("tritonclient/grpc/model_config_pb2.py is not installed (tritonclient==2.48.0, requirements.txt; "
                      "on a machine without it, the file alone beside protobuf: docs/benchmarks-gpu.md)")


model_config_pb2 = _load_pb2()
ModelConfig = model_config_pb2.ModelConfig


class ConfigError(ValueError):
    """A config's text that is not a ModelConfig, with where it came from."""


def parse(text, source="config text"):
    """The ModelConfig `text` describes; ConfigError names `source` (a file) and the parser's line and column."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as error:
        raise ConfigError(f"{source}: not a Triton model config: {error}") from None


def read(path):
    """The ModelConfig of the config file at `path` (OSError when there is none)."""
    with open(path, encoding="utf-8") as handle:
        return parse(handle.read(), path)


def to_text(config, header=""):
    """`config` as config.pbtxt text, after `header` (comment lines, each starting with #)."""
    return header + text_format.MessageToString(_message(config))


def one_line(message):
    """A ModelConfig, or one of its parts (an instance group, the dynamic batcher...), as text on one line."""
    return text_format.MessageToString(message, as_one_line=True)


def write(path, config, header=""):
    """`config` (with `header`) to `path`; a file already holding that text is left as it is (its mtime too: Triton's
    polling reloads no model over an unchanged config)."""
    text = to_text(config, header)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _message(config):
    return parse(config) if isinstance(config, str) else config


def _edited(config, edit):
    """A copy of `config` changed by edit(message), in the form `config` came in."""
    message = copy.deepcopy(_message(config))
    edit(message)
    return to_text(message) if isinstance(config, str) else message


# ---------------------------------------------------------------- reading
def parameters(config):
    """{key: string_value} of the config's `parameters` entries."""
    return {key: value.string_value for key, value in _message(config).parameters.items()}


def parameter(path, key, default=None):
    """One parameter of the config at `path`; `default` when the file or the parameter is missing (a file that does
    not parse raises ConfigError)."""
    try:
        config = read(path)
    except OSError:
        return default
    return config.parameters[key].string_value if key in config.parameters else default


def instance_count(config):
    """The first instance group's count; None without an instance group."""
    groups = _message(config).instance_group
    return groups[0].count if groups else None


def max_queue_size(config):
    """The dynamic batcher's default queue bound; None without a default queue policy."""
    batching = _message(config).dynamic_batching
    return batching.default_queue_policy.max_queue_size if batching.HasField("default_queue_policy") else None


def max_batch_size(config):
    return _message(config).max_batch_size


def declared(config):
    """The config's inputs then outputs as (name, data type name, dims as "a, b") triples, e.g.
    ("colbert_vectors", "TYPE_FP32", "-1, 32")."""
    message = _message(config)
    return [(tensor.name, model_config_pb2.DataType.Name(tensor.data_type), ", ".join(map(str, tensor.dims)))
            for tensor in [*message.input, *message.output]]


def step_models(config):
    """The model_name of each step of an ensemble config, in order."""
    return [step.model_name for step in _message(config).ensemble_scheduling.step]


def output_maps(config):
    """{ensemble tensor: step tensor} over every step's output_map of an ensemble config."""
    return {value: key for step in _message(config).ensemble_scheduling.step for key, value in step.output_map.items()}


# ---------------------------------------------------------------- editing (a copy)
def with_parameters(config, values):
    """`config` with the string_value of each parameter in `values` (key -> value) replaced; KeyError names a key
    the config has no parameter for."""
    def edit(message):
        for key, value in values.items():
            if key not in message.parameters:
                raise KeyError(key)
            message.parameters[key].string_value = str(value)
    return _edited(config, edit)


def with_new_parameters(config, values):
    """`config` with a string parameter for each key of `values` (added, or replaced)."""
    def edit(message):
        for key, value in values.items():
            message.parameters[key].string_value = str(value)
    return _edited(config, edit)


def with_instance_count(config, count):
    """`config` with its (first) instance group's count; KeyError when it has no instance group."""
    def edit(message):
        if not message.instance_group:
            raise KeyError("instance_group count")
        message.instance_group[0].count = int(count)
    return _edited(config, edit)


def with_max_queue_size(config, size):
    """`config` with its default queue policy's max_queue_size; KeyError when it has none."""
    def edit(message):
        if not message.dynamic_batching.HasField("default_queue_policy"):
            raise KeyError("default_queue_policy max_queue_size")
        message.dynamic_batching.default_queue_policy.max_queue_size = int(size)
    return _edited(config, edit)


def without_warmup(config):
    """`config` without its model_warmup samples."""
    return _edited(config, lambda message: message.ClearField("model_warmup"))


def with_output(config, name, data_type, dims):
    """`config` with one more output (data_type: its name, e.g. "TYPE_INT64")."""
    def edit(message):
        message.output.add(name=name, data_type=model_config_pb2.DataType.Value(data_type), dims=dims)
    return _edited(config, edit)


def merged(config, text, source="edit"):
    """`config` with ModelConfig text merged in (text_format.Merge: a scalar it names is replaced, a message it names
    is merged field by field, a repeated field gets its entries appended), e.g.
    `dynamic_batching { default_queue_policy { max_queue_size: 200 } }`. ConfigError names `source` when the text
    is not ModelConfig text."""
    def edit(message):
        try:
            text_format.Merge(text, message)
        except text_format.ParseError as error:
            raise ConfigError(f"{source}: not ModelConfig text: {error}") from None
    return _edited(config, edit)
