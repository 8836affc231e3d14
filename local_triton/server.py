"""tritonserver's command line (the project's flags from the settings, the models it loads) and its start, in a process
group of its own (process_group.py) with the environment its models read."""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile

from model_library import tracing

from .backends import (
    CONTAINER_SERVER,
    backend_dir_for,
    describe_onnxruntime_backend,
    in_container,
    onnxruntime_backend,
    preload_allocator,
    prepare_backends,
    pytriton_root,
    server_env,
)
from .process_group import Server, die_with_this_process
from .run_stats import record
from .settings import admin_key_for, keys_to_files, setting

RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"
# Triton 24.07's Python backend starts each stub through `bash -c` with the model path unquoted: a repository path
# with spaces or shell characters fails every Python model's load with a bash syntax error.
PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./+:@%=,-]+$")


def server_command(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(),
                   python=sys.executable, env=None, admin_key=None):
    """The tritonserver command line; settings come from `env` (default: this process's environment)."""
    address = setting("TRITON_ADDRESS", "127.0.0.1", env)
    admin_key = admin_key or admin_key_for(env)
    if not PLAIN_PATH.match(os.path.abspath(model_repository)):
        raise SystemExit(f"launch: the model repository path {os.path.abspath(model_repository)!r} has spaces or "
                         f"shell characters, which Triton 24.07's Python backend cannot start stubs from; use a "
                         f"path of letters, digits and -_./ only")
    if in_container():
        command = [CONTAINER_SERVER]
    else:
        command = [os.path.join(pytriton_root(), "tritonserver", "bin", "tritonserver"),
                   f"--backend-directory={prepare_backends(python, ort_folder=onnxruntime_backend(env))}"]
    command += [
        f"--model-repository={os.path.abspath(model_repository)}",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
        f"--http-address={address}", f"--grpc-address={address}",
        f"--metrics-address={setting('TRITON_METRICS_ADDRESS', address, env)}",
        f"--http-restricted-api={RESTRICTED_APIS}:admin-key={admin_key}",
        f"--grpc-restricted-protocol={RESTRICTED_APIS}:admin-key={admin_key}",
        "--allow-cpu-metrics=true",
        f"--exit-timeout-secs={int(setting('EXIT_TIMEOUT_S', '30', env))}",
    ]
    if setting("MODEL_CONTROL", "explicit", env) == "explicit":
        # A model an admin failed to load must not take the whole server out of service: with strict readiness
        # (the default) /v2/health/ready stays 400 until that model loads. Start-up failures still stop the server.
        command += ["--model-control-mode=explicit", "--strict-readiness=false"]
        names = [name.strip() for name in setting("LOAD_MODELS", "*", env).split(",")]
        if names == ["*"]:
            names = every_model(model_repository)
        command += [f"--load-model={name}" for name in with_bls_models(model_repository, names)]
    if setting("RATE_LIMIT", "on", env) == "on":
        command.append("--rate-limit=execution_count")  # honour the configs' rate_limiter sections
    if setting("MODEL_CONFIG_NAME", "", env):
        command.append(f"--model-config-name={setting('MODEL_CONFIG_NAME', '', env)}")
    command += trace_flags(env)
    return [*command, *extra_args]


def trace_flags(env=None):
    """tritonserver's --trace-config flags when the standard OpenTelemetry settings turn traces on
    (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT: model_library/tracing.py), else none: Triton's own spans (mode
    opentelemetry, level TIMESTAMPS) to the same OTLP/HTTP endpoint, its service.name the front's. Its rate is every
    Nth request; OTEL_TRACES_SAMPLER[_ARG] become one (trace_rate). Whatever the rate, Triton 24.07 traces every
    KServe request carrying a valid traceparent (src/tracer.cc: force_sample; not even its sampled flag is read)."""
    env = os.environ if env is None else env
    url = tracing.traces_url(env)
    if url is None:
        return []
    service = setting("OTEL_SERVICE_NAME", "", env) or next(
        (item.split("=", 1)[1].strip() for item in setting("OTEL_RESOURCE_ATTRIBUTES", "", env).split(",")
         if item.split("=", 1)[0].strip() == "service.name" and "=" in item), tracing.SERVICE_NAME)
    rate = trace_rate(setting("OTEL_TRACES_SAMPLER", "", env), setting("OTEL_TRACES_SAMPLER_ARG", "", env))
    return ["--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS", f"--trace-config=rate={rate}",
            "--trace-config=count=-1", f"--trace-config=opentelemetry,url={url}",
            f"--trace-config=opentelemetry,resource=service.name={service}"]


def trace_rate(sampler, argument):
    """OpenTelemetry's sampler setting as Triton's rate (trace every Nth request; 0: only requests that carry a
    context). always_on and the parent-based default: 1; always_off: 0; a trace id ratio p: round(1/p) (0 when p is
    0). Another sampler (jaeger_remote...) has no equivalent: 1."""
    sampler = (sampler or "parentbased_always_on").strip().lower()
    if sampler in ("always_off", "parentbased_always_off"):
        return 0
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        try:
            ratio = float(argument) if argument.strip() else 1.0
        except ValueError:
            raise SystemExit(f"launch: OTEL_TRACES_SAMPLER_ARG={argument!r} is not a ratio from 0 to 1") from None
        if not 0 <= ratio <= 1:
            raise SystemExit(f"launch: OTEL_TRACES_SAMPLER_ARG={argument!r} is not a ratio from 0 to 1")
        return 0 if ratio == 0 else max(1, round(1 / ratio))
    return 1


# The default export's folders: until build/export.py exports into them (without --name) they hold only templates
# and code (their config.pbtxt is generated; the tokenizer's is tracked, its tokenizer.json generated), and Triton
# cannot load them.
DEFAULT_EXPORT_FOLDERS = ("tokenizer", "embedding", "ensemble", "ensemble_bls", "rerank", "late_chunking")

def every_model(model_repository):
    """LOAD_MODELS=*: every model of the repository but the default export's folders that nothing was exported into
    (a repository holding only named exports, e.g. a CLIP one, serves them alone)."""
    if not os.path.isdir(model_repository):
        return ["*"]  # Triton says what is wrong with it

    def exported(folder):
        generated = os.path.join("1", "tokenizer.json") if folder == "tokenizer" else "config.pbtxt"
        return folder not in DEFAULT_EXPORT_FOLDERS or \
            os.path.isfile(os.path.join(model_repository, folder, generated))

    return sorted(entry for entry in os.listdir(model_repository) if not entry.startswith(".") and
                  os.path.isdir(os.path.join(model_repository, entry)) and exported(entry))


def with_bls_models(model_repository, names):
    """`names` plus, for each export among them, its BLS, rerank, late chunking and image models (Triton loads an
    ensemble's steps with it, but not the models that call it through BLS, nor a CLIP export's image ensemble: their
    names are in the export's export.json), and the supervisor,
    which always runs when the repository has it."""
    found = list(names)
    if "*" not in found and "supervisor" not in found and \
            os.path.isfile(os.path.join(model_repository, "supervisor", "config.pbtxt")):
        found.append("supervisor")
    for name in names:
        try:
            with open(os.path.join(model_repository, name, "1", "export.json"), encoding="utf-8") as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        found += [manifest[key] for key in ("bls_model", "rerank_model", "chunks_model", "image_model")
                  if manifest.get(key) not in (None, *found)]
    return found


def start(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(), log_file=None,
          extra_env=None, python=sys.executable):
    """tritonserver in a process group of its own (its stubs join it; our signal handling decides when it stops),
    killed by the kernel should this process end without stopping it (die_with_this_process)."""
    env = server_env(python)
    env.update(extra_env or {})
    if onnxruntime_backend(env):  # the C++ backend's libtritonserver.so link (prepare_backends lays it out)
        env["LD_LIBRARY_PATH"] = os.pathsep.join((os.path.join(backend_dir_for(python, True), "lib"),
                                                  env.get("LD_LIBRARY_PATH", "")))
    # Which code serves the encoder, for the proxy's /v1/models
    env["TRITON_EMBED_ONNXRUNTIME_BACKEND"] = describe_onnxruntime_backend(env)
    preload_allocator(env)
    # The proxy calls Triton's own HTTP frontend (readiness, repository API): where it is, for the models to read.
    env["TRITON_HTTP_PORT"] = str(http_port)
    # Which server that port must answer as (its --id, in its metadata): the proxy never takes another server's
    # readiness for its own (an orphan left on the port). One per start.
    env["TRITON_SERVER_ID"] = f"triton-embed-{secrets.token_hex(6)}"
    # The keys as files, not values: every Python stub inherits this environment (keys_to_files). The admin key is
    # read back from its file, so the launcher and the proxy see the same one.
    keys_dir = keys_to_files(env)
    # The drain's word to the models that feed work piece by piece (model_common.Deadline): once this file exists
    # they start no next piece, so what cannot finish within the exit timeout stops, cleanly (drain()).
    run_dir = tempfile.mkdtemp(prefix="triton-embed-run-")
    env["TRITON_EMBED_STOP_FILE"] = os.path.join(run_dir, "stopping")
    try:
        admin_key = admin_key_for(env)
        command = server_command(model_repository, http_port, grpc_port, metrics_port,
                                 (f"--id={env['TRITON_SERVER_ID']}", *extra_args), python, env, admin_key)
        process = subprocess.Popen(command, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT if log_file else None,
                                   start_new_session=True, preexec_fn=die_with_this_process())
    except BaseException:
        for directory in (keys_dir, run_dir):
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
        raise
    server = Server(process, admin_key, http_port, setting("TRITON_ADDRESS", "127.0.0.1", env), keys_dir)
    server.run_dir, server.stop_file = run_dir, env["TRITON_EMBED_STOP_FILE"]
    record("server_start", repository=os.path.abspath(str(model_repository)))
    return server
