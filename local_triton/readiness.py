"""The models' readiness, at both ends of a server's life: wait_ready until tritonserver answers ready after a start;
drain at SIGTERM, the public models unloaded callers first while each finishes what it admitted (and, past a third
of the bound, the stop file that tells the models to start no next piece)."""
import glob
import json
import os
import time

from model_library.triton_server import TritonHttp

from .run_stats import record


def public_tiers(model_repository):
    """The models clients call, in the order a drain stops them: the proxy (HTTP, it calls the rest); each export's
    rerank model (it calls the BLS model); the ensembles and BLS models (they call the steps, which stay until
    tritonserver stops)."""
    tiers = [["proxy"], [], []]
    for path in sorted(glob.glob(os.path.join(model_repository, "*", "1", "export.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        tiers[1].append(manifest.get("rerank_model"))
        tiers[2] += [manifest.get("name"), manifest.get("bls_model"), manifest.get("chunks_model")]
    return [[model for model in tier if model] for tier in tiers]


STOP_FEEDING_AT = 1 / 3  # of the drain's bound: then the models start no next piece (work abandoned by its client
# or longer than the exit timeout: a 2,000-sentence rerank kept 6 models busy past it, and the stubs died at exit);
# the rest of the bound is for the pieces running then (a rerank piece of 256 passages: ~8 s on 2 busy cores)


def stop_feeding(server):
    """Creates the server's stop file (TRITON_EMBED_STOP_FILE); True the first time."""
    if not server.stop_file or os.path.exists(server.stop_file):
        return False
    with open(server.stop_file, "w", encoding="utf-8"):
        pass
    return True


QUIET_S = 5.0  # no model finished a request or an execution for this long: no request runs (an encoder run of a
# piece takes seconds on 2 busy cores, and every request in flight ends its steps now and then)


class Activity:
    """Whether requests still run while the drain waits. A running request's steps finish now and then (the models a
    draining model calls are still served), so Triton's statistics of the models it serves (/v2/models/stats; an
    unloading model's own are not served) move; a wait on a model that runs nothing moves none (issue 59: an idle
    server's drain said requests were running). Read at most once a second; unreadable counts as running."""

    def __init__(self, triton, now):
        self.triton, self.read, self.moved = triton, now, float("-inf")
        self.counts = self.sample()

    def sample(self):
        answer = self.triton.call("GET", "/v2/models/stats", timeout=2.0)
        if answer is None or answer[0] != 200:
            return None
        try:
            return {(stats["name"], stats["version"]): stats["execution_count"] + sum(
                stats["inference_stats"][kind]["count"] for kind in ("success", "fail"))
                for stats in json.loads(answer[1])["model_stats"]}
        except (ValueError, KeyError, TypeError):
            return None

    def running(self, now):
        if now - self.read >= 1.0:
            counts, self.read = self.sample(), now
            if counts is None or self.counts is None or \
                    any(counts.get(model, done) > done for model, done in self.counts.items()):
                self.moved = now
            self.counts = counts
        return now - self.moved < QUIET_S


def drain(server, model_repository, bound_s, interrupted=lambda: False):
    """SIGTERM's first phase: stop taking work without cutting any. Triton's own stop refuses every new request at
    once, the calls an admitted request still has to make to its next step included (a BLS model's encoder runs,
    the proxy's calls): those requests failed. So the public models are unloaded first, callers before callees:
    each refuses new requests at once and finishes the admitted ones (the proxy's /health and new requests get 503
    "shutting down" meanwhile), while the steps they call stay loaded. True when all of it finished within bound_s;
    then tritonserver has nothing in flight and stops at once."""
    started = time.monotonic()
    deadline = started + bound_s
    try:
        activity = Activity(server.triton, started)
        for tier in public_tiers(model_repository):
            states = server.model_states()
            serving = [model for model in tier if "READY" in states.get(model, ())]
            for model in serving:
                server.triton.control("unload", model, timeout=5.0)
            while True:
                states = server.model_states()
                waiting = [model for model in serving if states.get(model, set()) & {"READY", "UNLOADING"}]
                if not waiting:
                    break
                now = time.monotonic()
                running = activity.running(now)
                if now > deadline:  # which models held it, for the log (Triton's own stop waits for them too)
                    print(f"launch: drain: {', '.join(waiting)} not unloaded within {bound_s:.0f} s", flush=True)
                    return False
                if interrupted() or server.poll() is not None:
                    return False
                if now > started + bound_s * STOP_FEEDING_AT and stop_feeding(server):
                    print(f"launch: drain: past {bound_s * STOP_FEEDING_AT:.0f} s, " + (
                        "requests still running start no next piece (they fail 'the server is stopping')" if running
                        else f"waiting for {', '.join(waiting)} to unload (no request is running)"), flush=True)
                time.sleep(0.1)
    except (OSError, ValueError, KeyError, RuntimeError) as error:  # MODEL_CONTROL=none: no unloads; Triton's stop
        print(f"launch: drain: {error}", flush=True)
        return False
    return True


def wait_ready(server, http_port, timeout_s=300.0, address="127.0.0.1"):
    """Block until /v2/health/ready answers 200; raise if the server exits or the time runs out."""
    triton = TritonHttp(address, http_port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {server.process.returncode} before it was ready")
        if triton.server_ready(timeout=2.0):
            server.note_regions()
            if getattr(server, "started", None):  # a launch.Server (tests pass stand-ins)
                record("server_ready", seconds=time.monotonic() - server.started)
            return
        time.sleep(0.5)
    raise TimeoutError(f"tritonserver not ready on port {http_port} after {timeout_s:.0f} s")
