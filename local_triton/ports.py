"""Which of the launcher's ports are taken, and by whom: the launcher says so in one line and stops, instead of
starting a tritonserver that dies on its first bind (or, worse, a proxy that reads another server's readiness).

The owner comes from /proc: the LISTEN socket's inode in /proc/net/tcp{,6}, then the process whose /proc/<pid>/fd
holds `socket:[inode]`. Processes of other users are not readable: then the owner is unknown, the port still taken.

Which ports are the launcher's: server_ports (tritonserver's HTTP, gRPC and metrics ports, and the proxy's when it
loads); taken_line says which of them are taken, in the launcher's one line.
"""
import errno
import glob
import os
import re
import socket

from .server import every_model
from .settings import setting

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
# A command line is printed, and tritonserver's carries the admin key (--http-restricted-api=...:admin-key=<key>).
KEY_VALUE = re.compile(r"(key[=:])[^\s,]+", re.IGNORECASE)


def listening_inodes(port, proc="/proc"):
    """The inodes of the LISTEN sockets on `port` (any address, IPv4 and IPv6) in this network namespace."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), encoding="ascii") as handle:
                next(handle, None)  # the header
                for line in handle:
                    fields = line.split()
                    # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                    if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(int(fields[9]))
        except (OSError, ValueError, IndexError):
            continue
    inodes.discard(0)
    return inodes


def socket_pids(inodes, proc="/proc", pids=None):
    """{pid: inode} of the processes (of those in `pids`, default all) that hold one of these sockets."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found = {}
    if not wanted:
        return found
    if pids is None:
        pids = [int(path.rsplit("/", 1)[1]) for path in glob.glob(os.path.join(proc, "[0-9]*"))]
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for name in names:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except OSError:
                continue
            if target in wanted:
                found[pid] = wanted[target]
                break
    return found


def command_of(pid, proc="/proc", limit=160):
    """`pid`'s command line on one line, keys masked, cut to `limit` characters ('' when unreadable)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            args = [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return ""
    text = KEY_VALUE.sub(r"\1***", " ".join(" ".join(arg.split()) for arg in args))  # one line
    return text if len(text) <= limit else text[:limit - 3] + "..."


def port_owner(port, proc="/proc"):
    """(pid, command) of a process listening on `port`, the lowest pid when several share the socket (a forked
    server's children); None when nobody listens or the holder is not readable (another user's)."""
    holders = socket_pids(listening_inodes(port, proc), proc)
    if not holders:
        return None
    pid = min(holders)
    return pid, command_of(pid, proc)


def bind_error(address, port):
    """None if `port` can be bound on `address` now (as a server binds it: SO_REUSEADDR, so sockets of closed
    connections in TIME_WAIT do not count), else the OSError."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except OSError as error:
        return error
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as error:
            return error
    return None


def taken(ports, proc="/proc"):
    """[(role, address, port, why)] for the (role, address, port) entries that cannot be bound now."""
    found = []
    for role, address, port in ports:
        error = bind_error(address, port)
        if error is None:
            continue
        if error.errno == errno.EADDRINUSE:
            owner = port_owner(port, proc)
            why = f"in use by pid {owner[0]} ({owner[1] or '?'})" if owner else \
                "in use (by a process this user cannot see)"
        else:
            why = f"cannot be bound on {address}: {error.strerror or error}"
        found.append((role, address, port, why))
    return found


def describe(found):
    """One line for what taken() found, e.g. `port 8000 (HTTP), port 8001 (gRPC): in use by pid 4242 (tritonserver
    ...); port 8080 (proxy): in use by ...`: each owner is named once."""
    by_why = {}
    for role, _, port, why in found:
        by_why.setdefault(why, []).append(f"port {port} ({role})")
    return "; ".join(f"{', '.join(ports)}: {why}" for why, ports in by_why.items())


def _proxy_parameter(path, key):
    """A `parameters { key: "<key>" value: { string_value: "..." } }` line of the proxy's config.pbtxt, or None.
    Read here, not through Triton's ModelConfig (exporter/pbtxt.py): the launcher runs in the tritonserver
    image, which has neither protobuf nor tritonclient's model_config_pb2. It only reads (never edits), a file the
    project writes one parameter a line (model_source/proxy/config.pbtxt); comment lines are skipped."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle if not line.lstrip().startswith("#")]
    except OSError:
        return None
    found = re.search(r'key:\s*"' + re.escape(key) + r'"\s*value:?\s*\{\s*string_value:\s*"([^"]*)"', "".join(lines))
    return found.group(1) if found else None


def server_ports(model_repository, http_port=8000, grpc_port=8001, metrics_port=8002, extra_args=(), env=None):
    """[(role, address, port)] of what tritonserver will bind: its HTTP, gRPC and metrics ports (unless extra_args
    turn one off), and the proxy's (PROXY_HOST / PROXY_PORT, else its config.pbtxt's) when the proxy loads."""
    address = setting("TRITON_ADDRESS", "127.0.0.1", env)
    found = [(role, bind, port) for role, bind, port in (
        ("HTTP", address, http_port), ("gRPC", address, grpc_port),
        ("metrics", setting("TRITON_METRICS_ADDRESS", address, env), metrics_port))
        if f"--allow-{role.lower()}=false" not in extra_args]
    config = os.path.join(model_repository, "proxy", "config.pbtxt")
    if os.path.isfile(config):
        names = [name.strip() for name in setting("LOAD_MODELS", "*", env).split(",")]
        if setting("MODEL_CONTROL", "explicit", env) != "explicit" or "proxy" in names or \
                (names == ["*"] and "proxy" in every_model(model_repository)):
            host = setting("PROXY_HOST", _proxy_parameter(config, "host") or "0.0.0.0", env)
            found.append(("proxy", host, int(setting("PROXY_PORT", _proxy_parameter(config, "port") or 8080, env))))
    return found


def taken_line(listed):
    """The one line that says which of the server_ports() `listed` are taken and by whom; '' when all are free."""
    found = taken(listed)
    if not found:
        return ""
    return (f"launch: {describe(found)}; not starting tritonserver (free the port or choose another: "
            f"HTTP_PORT, GRPC_PORT, METRICS_PORT, PROXY_PORT)")
