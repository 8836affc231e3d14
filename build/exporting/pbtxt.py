"""The one reader of Triton's config.pbtxt text for the tools beside the serving code (export, bench): the few
top-level values they need, read with regular expressions (no protobuf schema: Triton's model_config.proto is not
on PyPI). Serving code never imports this: each model gets its config from Triton as JSON (args["model_config"])."""
import re

PARAMETER = re.compile(r'key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}')
MAX_BATCH_SIZE = re.compile(r"^max_batch_size:\s*(\d+)", re.M)


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def parameters(text):
    """{key: string_value} of the config's `parameters` entries."""
    return dict(PARAMETER.findall(text))


def parameter(path, key, default=None):
    """One parameter of the config at `path`; `default` when the file or the parameter is missing."""
    try:
        return parameters(read(path)).get(key, default)
    except OSError:
        return default


def with_parameters(text, values):
    """`text` with the string_value of each parameter in `values` (key -> value) replaced; KeyError names a key the
    config has no parameter for."""
    for key, value in values.items():
        pattern = rf'(key:\s*"{re.escape(key)}"\s*value:\s*\{{\s*string_value:\s*)"[^"]*"'
        text, found = re.subn(pattern, lambda match, value=value: f'{match.group(1)}"{value}"', text)
        if found != 1:
            raise KeyError(key)
    return text


# The first instance group's count: `instance_group [ { kind: KIND_CPU, count: 2, rate_limiter { resources [ { ...
# count: 1 } ] } } ]` (the resources' counts come after it); the dynamic batcher's default queue bound.
INSTANCE_COUNT = re.compile(r"(instance_group\s*\[\s*\{[^}]*?\bcount:\s*)(\d+)")
MAX_QUEUE_SIZE = re.compile(r"(default_queue_policy\s*\{[^}]*?\bmax_queue_size:\s*)(\d+)")


def instance_count(text):
    match = INSTANCE_COUNT.search(text)
    return int(match.group(2)) if match else None


def max_queue_size(text):
    match = MAX_QUEUE_SIZE.search(text)
    return int(match.group(2)) if match else None


def with_instance_count(text, count):
    """`text` with its (first) instance group's count; KeyError when it has no instance group with a count."""
    text, found = INSTANCE_COUNT.subn(lambda match: f"{match.group(1)}{int(count)}", text, count=1)
    if not found:
        raise KeyError("instance_group count")
    return text


def with_max_queue_size(text, size):
    """`text` with its default queue policy's max_queue_size; KeyError when it has none."""
    text, found = MAX_QUEUE_SIZE.subn(lambda match: f"{match.group(1)}{int(size)}", text, count=1)
    if not found:
        raise KeyError("default_queue_policy max_queue_size")
    return text


def max_batch_size(text):
    match = MAX_BATCH_SIZE.search(text)
    return int(match.group(1)) if match else 0
