"""Images over HTTP (CLIP exports): the items a client sends made into the encoded bytes the export's image model
takes. The proxy never decodes an image (the image model does, and names the row it refuses); it undoes the
transport only: base64 (standard or URL-safe, padded or not), `data:` URIs, and http(s) URLs, within the settings
(model.py, config.pbtxt):
  max_image_bytes, max_images_per_request   every image / every request
  image_url_hosts                           the hosts URLs may name (comma-separated); empty: no URL is fetched
  image_url_max_bytes, image_url_timeout_s  per URL: body size, total time (redirects included)
  image_url_allow_private                   false: refuse hosts that resolve to private, loopback, link-local,
                                            reserved, multicast or unspecified addresses
Each URL and each of its redirects (at most MAX_REDIRECTS) is checked against the allow-list and the address rule,
and the connection goes to the very address that was checked (no second DNS answer: no rebinding). Fetching blocks,
so it runs in threads, never on the event loop."""
import asyncio
import base64
import binascii
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

from model_library.model_errors import ErrorKind

from .errors import ApiError

MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")  # base64 has no ':'
URLSAFE = str.maketrans("-_", "+/")


class FetchError(Exception):
    """Why a URL gave no image (the cause, for the client)."""


def allowed_hosts(settings):
    return {host.strip().lower() for host in settings.image_url_hosts.split(",") if host.strip()}


async def load(items, param, settings, indices=None):
    """The images of a request -> their encoded bytes, in order. items: strings (base64, data URI or URL); each is
    named `param[index]` in errors (indices: the client's index of each item; default 0..n-1)."""
    indices = list(range(len(items))) if indices is None else list(indices)
    if len(items) > settings.max_images_per_request:
        raise ApiError(f"{len(items)} images is over the limit of {settings.max_images_per_request} per request "
                       f"(setting max_images_per_request)", ErrorKind.TOO_MANY, param)
    images, urls = [], []
    for index, item in zip(indices, items):
        where = f"{param}[{index}]"
        scheme = SCHEME.match(item)
        if scheme and scheme[1].lower() in ("http", "https"):
            if not allowed_hosts(settings):
                raise ApiError("is a URL, and fetching images from URLs is off: send the image as base64 or a data "
                               "URI, or set image_url_hosts (PROXY_IMAGE_URL_HOSTS) to the hosts to fetch from",
                               ErrorKind.IMAGE_URLS_OFF, param, where)
            urls.append((len(images), where, item))
            images.append(None)
        elif scheme and scheme[1].lower() != "data":
            raise ApiError(f"{where}: a '{scheme[1]}:' URL is not fetched (http and https only)",
                           ErrorKind.INVALID_INPUT, param, where, leads=False)
        else:
            images.append(decode(item, where, param, settings.max_image_bytes))
    fetched = await asyncio.gather(*(asyncio.to_thread(fetch_item, url, where, param, settings)
                                     for _, where, url in urls))
    for (k, _, _), data in zip(urls, fetched):
        images[k] = data
    return images


def decode(item, where, param, limit):
    """base64 or a data URI -> bytes."""
    if item[:5].lower() == "data:":
        header, comma, payload = item[5:].partition(",")
        if not comma:
            raise ApiError("is not a valid data URI (no ',')", ErrorKind.INVALID_INPUT, param, where)
        media = header.split(";")[0].strip().lower()
        if not media.startswith("image/"):  # RFC 2397: no media type means text/plain
            raise ApiError(f"is a data URI of {media[:40] or 'text/plain'}, not of an image type (image/png, "
                           f"image/jpeg...)", ErrorKind.INVALID_INPUT, param, where)
        data = base64_bytes(payload, where, param, limit) if header.lower().endswith(";base64") else \
            unquote_to_bytes(payload)
    else:
        data = base64_bytes(item, where, param, limit)
    if not data:
        raise ApiError("is empty", ErrorKind.INVALID_INPUT, param, where)
    if len(data) > limit:
        raise too_large(where, param, len(data), limit)
    return data


def base64_bytes(text, where, param, limit):
    text = "".join(text.split()).rstrip("=")
    if len(text) * 3 // 4 > limit:  # refused before decoding it
        raise too_large(where, param, len(text) * 3 // 4, limit)
    try:
        return base64.b64decode(text.translate(URLSAFE) + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("is neither base64 (standard or URL-safe), a data URI nor an http(s) URL",
                       ErrorKind.INVALID_INPUT, param, where) from None


def too_large(where, param, size, limit):
    return ApiError(f"has {size} bytes, over the limit of {limit} (setting max_image_bytes)", ErrorKind.IMAGE_TOO_LARGE,
                    param, where)


def fetch_item(url, where, param, settings):
    try:
        return fetch(url, settings)
    except FetchError as error:
        raise ApiError(f"could not be fetched: {error}", ErrorKind.IMAGE_FETCH_FAILED, param, where) from None


def fetch(url, settings):
    """GET url -> its body, following at most MAX_REDIRECTS redirects, each checked as the first URL. Blocking."""
    hosts, limit = allowed_hosts(settings), min(settings.image_url_max_bytes, settings.max_image_bytes)
    deadline = time.monotonic() + settings.image_url_timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        if scheme not in ("http", "https"):
            raise FetchError(f"'{scheme}:' URLs are not fetched (http and https only)")
        if host not in hosts:
            raise FetchError(f"host '{host}' is not in image_url_hosts")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise FetchError(f"the port of '{host}' is not valid") from None
        address = checked_address(host, port, settings.image_url_allow_private)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        status, location, body = get(scheme, host, port, address, target, deadline, limit, settings)
        if status in REDIRECTS and location:
            url = urljoin(url, location)
            continue
        if status != 200:
            raise FetchError(f"the server answered HTTP {status}")
        return body
    raise FetchError(f"more than {MAX_REDIRECTS} redirects")


def checked_address(host, port, allow_private):
    """The first address `host` resolves to that may be fetched from: the one to connect to."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise FetchError(f"host '{host}' does not resolve ({error})") from None
    refused = None
    for *_, address in found:
        ip = ipaddress.ip_address(address[0].split("%")[0])
        if allow_private or public(ip):
            return address[0]
        refused = ip
    raise FetchError(f"host '{host}' resolves to {refused}, a private, loopback, link-local, reserved, multicast or "
                     f"unspecified address (setting image_url_allow_private)")


def public(ip):
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_global and not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or
                                 ip.is_multicast or ip.is_unspecified)


class PinnedConnection(http.client.HTTPConnection):
    """HTTP(S) to `address` (checked), with the Host header and TLS name of `host`."""

    def __init__(self, host, port, address, timeout, tls):
        super().__init__(host, port, timeout=timeout)
        self.address, self.tls = address, tls
        self.default_port = 443 if tls else 80

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host) if self.tls else sock


def get(scheme, host, port, address, target, deadline, limit, settings):
    """One GET -> (status, Location, body). A watchdog shuts the socket at the deadline: the total time is bounded
    even for a server that sends a byte at a time."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise FetchError(f"timed out after {settings.image_url_timeout_s:g} s (setting image_url_timeout_s)")
    connection = PinnedConnection(host, port, address, remaining,
                                  ssl.create_default_context() if scheme == "https" else None)
    expired = threading.Event()

    def expire():
        expired.set()
        if connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    watchdog = threading.Timer(remaining, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("GET", target, headers={"User-Agent": "triton-embed-proxy", "Accept": "image/*"})
        response = connection.getresponse()
        if response.status != 200:
            return response.status, response.getheader("Location"), b""
        declared = response.getheader("Content-Length") or ""
        if declared.isdigit() and int(declared) > limit:
            raise FetchError(f"its Content-Length {declared} is over the limit of {limit} bytes (settings "
                             f"image_url_max_bytes, max_image_bytes)")
        chunks, size = [], 0
        while chunk := response.read1(65536):
            size += len(chunk)
            if size > limit:
                raise FetchError(f"its body is over the limit of {limit} bytes (settings image_url_max_bytes, "
                                 f"max_image_bytes)")
            chunks.append(chunk)
        if expired.is_set():
            raise TimeoutError
        if declared.isdigit() and size < int(declared):
            raise FetchError(f"the connection closed after {size} of {declared} bytes")
        return 200, None, b"".join(chunks)
    except (OSError, http.client.HTTPException) as error:
        if expired.is_set() or isinstance(error, TimeoutError):
            raise FetchError(f"timed out after {settings.image_url_timeout_s:g} s (setting image_url_timeout_s)") \
                from None
        raise FetchError(f"{type(error).__name__}: {error}") from None
    finally:
        watchdog.cancel()
        connection.close()
