"""The one client of Triton's own HTTP frontend that the project's code outside a model's inference uses: the proxy
(readiness, configs, load and unload), the supervisor (readiness, the repository index, reloads, metrics) and the
launcher (ready, drain at shutdown). Plain Python (http.client): build/export.py installs it beside the proxy's and
the supervisor's model.py; the launcher imports it from model_library.

The repository API is restricted: the launcher puts its key on tritonserver's command line
(--http-restricted-api=model-repository,...:admin-key=<key>) and hands it to the proxy; the supervisor reads it
from that command line. `headers` carries it.

Not pb_utils' is_model_ready / load_model / unload_model: in python_backend r24.07 those model-loader messages
corrupt the stub's shared-memory allocator now and then (fixed upstream in python_backend b49d9e2): polled every
second, tritonserver aborted at shutdown, and a second failed load killed the proxy's stub.
"""
import http.client
import json
from urllib.parse import quote

LOAD_TIMEOUT_S = 900.0  # a load answers once the model is loaded (bge-m3: minutes)
ANY_ADDRESS = ("0.0.0.0", "", "::", "[::]")  # a server bound to every address is called on loopback


class TritonHttp:
    def __init__(self, host, port, headers=None):
        self.host = "127.0.0.1" if host in ANY_ADDRESS else host
        self.port, self.headers = int(port), dict(headers or {})

    def call(self, method, path, body=None, headers=None, timeout=5.0, port=None):
        """(status, body), or None when nothing answers (not up yet, or stopping). `port`: another of the server's
        ports (metrics, the proxy's). A connection per call, closed after it: at shutdown Triton waits for the HTTP
        connections open to it before it unloads the models."""
        connection = http.client.HTTPConnection(self.host, port or self.port, timeout=timeout)
        try:
            connection.request(method, path, body, {**self.headers, **(headers or {}), "Connection": "close"})
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def ready(self, model):
        """True / False; None when Triton does not answer."""
        answer = self.call("GET", f"/v2/models/{quote(model, safe='')}/ready")
        return None if answer is None else answer[0] == 200

    def server_ready(self, timeout=5.0):
        answer = self.call("GET", "/v2/health/ready", timeout=timeout)
        return answer is not None and answer[0] == 200

    def config(self, model):
        answer = self.call("GET", f"/v2/models/{quote(model, safe='')}/config")
        return json.loads(answer[1]) if answer is not None and answer[0] == 200 else None

    def repository(self, path, body=b"{}", timeout=5.0):
        return self.call("POST", f"/v2/repository{path}", body, {"Content-Type": "application/json"}, timeout)

    def control(self, action, model, unload_dependents=False, timeout=LOAD_TIMEOUT_S):
        """Load (answers once loaded) or unload (answers at once); RuntimeError with Triton's reason."""
        body = json.dumps({"parameters": {"unload_dependents": True}} if unload_dependents else {}).encode()
        answer = self.repository(f"/models/{quote(model, safe='')}/{action}", body, timeout)
        if answer is None or answer[0] != 200:
            try:
                message = json.loads(answer[1])["error"]
            except (TypeError, ValueError, KeyError):
                message = "Triton's repository API did not answer" if answer is None else \
                    answer[1].decode(errors="replace")
            raise RuntimeError(message)

    def states(self):
        """{model: set of its versions' states} from the repository index; None when not available."""
        answer = self.repository("/index")
        if answer is None or answer[0] != 200:
            return None
        states = {}
        for entry in json.loads(answer[1]):
            states.setdefault(entry["name"], set()).add(entry.get("state", ""))
        return states
