"""Kubernetes exec probe for the triton-embed container: `python3 probe.py ready|live`.

Why an exec probe: Triton's HTTP port (8000) binds 127.0.0.1 by default (TRITON_ADDRESS), so the kubelet's
httpGet, which connects to the pod IP, cannot reach /v2/health/*. This script runs inside the container, where
127.0.0.1 works, and checks both servers of the pod:

  ready: Triton  GET /v2/health/ready  (server started and not shutting down; the launcher passes
                                       --strict-readiness=false, so a failed admin load does not count)
         proxy   GET /health           (the served ensembles are ready and no stub is dead, as the proxy sees it)
  live:  Triton  GET /v2/health/live
         proxy   GET /health/live      (the proxy's HTTP thread answers; a dead proxy stub is otherwise never noticed)

Exit 0 when every check answers 2xx within the timeout, else 1 with one line naming the failed check (the kubelet
records it in the pod's events). Ports and hosts follow the container's own settings, so the probe stays right when
the ConfigMap changes them: HTTP_PORT (Triton HTTP, default 8000), TRITON_ADDRESS, PROXY_PORT (8080), PROXY_HOST;
PROBE_TIMEOUT_S (2). Standard library only: the image's python3 (3.10) runs it.
"""
import os
import sys
import urllib.error
import urllib.request

CHECKS = {
    "ready": (("triton", "/v2/health/ready"), ("proxy", "/health")),
    "live": (("triton", "/v2/health/live"), ("proxy", "/health/live")),
}
WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def _host(address_var, port_var, default_port):
    """Where to connect from inside the container: loopback when the server binds every interface."""
    address = os.environ.get(address_var, "").strip()
    host = "127.0.0.1" if address in WILDCARDS else address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    port = os.environ.get(port_var, "").strip() or default_port
    return f"{host}:{port}"


def targets(kind):
    servers = {"triton": _host("TRITON_ADDRESS", "HTTP_PORT", "8000"),
               "proxy": _host("PROXY_HOST", "PROXY_PORT", "8080")}
    return [f"http://{servers[server]}{path}" for server, path in CHECKS[kind]]


def main(argv):
    if len(argv) != 2 or argv[1] not in CHECKS:
        print(f"usage: {os.path.basename(argv[0])} {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    timeout = float(os.environ.get("PROBE_TIMEOUT_S", "") or 2)
    for url in targets(argv[1]):
        try:
            with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310 (loopback, fixed scheme)
                pass
        except urllib.error.HTTPError as error:
            print(f"{argv[1]}: {url} answered HTTP {error.code}")
            return 1
        except Exception as error:  # refused, timed out, reset: all mean not ready / not alive
            print(f"{argv[1]}: {url} failed: {error}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
