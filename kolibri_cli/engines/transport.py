"""JSON over HTTP to an inference server under one policy, for every engine call.

- The URL is exact: a redirect is an error, never followed, so the API key (KOLIBRI_API_KEY,
  else OPENAI_API_KEY, as a bearer token) and credentials written into the URL (`user:pass@`, as
  HTTP Basic) reach the configured scheme, host and port only.
- `timeout` is a deadline for the whole answer, retries included: every wait on the socket
  (connect, send, each read) ends at it, so a server that drips a byte at a time is cut off.
- Every body is read up to a byte cap (the caller sizes it; BODY_BYTES by default), refused
  past it without holding more; no content encoding is asked for, so none is inflated.
- Connection failures and the statuses a busy or loading server answers (429, 502, 503, 504)
  are retried with backoff; anything else fails at once. Errors are one line; the key and the
  URL's credentials never appear in one.
Non-goals: streaming, proxies, concurrency (timing needs one request at a time), the answer's
schema (answers.py).
"""

import base64
import http.client
import io
import json
import os
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import clean, shown

API_KEY_VARS = ("KOLIBRI_API_KEY", "OPENAI_API_KEY")
RETRY_STATUSES = frozenset({429, 502, 503, 504})
BODY_BYTES = 4 << 20  # default cap of an answer (/props with a chat template, /metrics: ~100 KB)
ERROR_BYTES = 64 << 10  # what is read of an error's body (its message)
MAX_TIMEOUT = 1e6  # seconds (11 days); a socket's timeout overflows past ~1e11 (inf included)


class _Retryable(Exception):
    """A failure worth another attempt; `reason` is the user-facing explanation."""

    def __init__(self, reason: str):
        self.reason = reason


class _Deadline(Exception):
    """The request's deadline passed."""


def api_key() -> str | None:
    return next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), None)


def redacted(text: str) -> str:
    """`text` with the API key replaced (a server may echo it in an error)."""
    key = api_key()
    return text.replace(key, "***") if key else text


def masked(url: str) -> str:
    """`url` without user:password (what messages show)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL (a server's Location header): hide what precedes an @
        return "***@" + url.rsplit("@")[-1] if "@" in url else url
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@")[-1]))


@dataclass(frozen=True)
class Origin:
    """Where every request of one server goes: scheme, host and port, a path prefix, and the
    credentials written into its URL (sent nowhere else)."""

    scheme: str  # http or https
    host: str
    port: int
    prefix: str  # the URL's path, "" or "/something" (prepended to every request's path)
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> "Origin":
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError as e:  # "http://[::1"
            raise KolibriError(f"engine URL {shown(url.split('@')[-1], 120)}: {e}") from None
        where = shown(masked(url), 120)
        if parts.scheme not in ("http", "https"):
            raise KolibriError(f"engine URL {where} must start with http:// or https://")
        if parts.query or parts.fragment:
            raise KolibriError(f"engine URL {where}: a base URL has no ?query or #fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise KolibriError(f"engine URL {where}: the port is not a number in 1..65535"
                               ) from None
        if not parts.hostname:
            raise KolibriError(f"engine URL {where} names no host")
        if not parts.hostname.isprintable() or " " in parts.hostname:
            raise KolibriError(f"engine URL {where}: the host holds spaces or control characters")
        unquote = urllib.parse.unquote
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"),
                   None if parts.username is None else unquote(parts.username),
                   None if parts.password is None else unquote(parts.password))

    def authorization(self) -> str | None:
        """The URL's user:password as Basic, else the API key as Bearer, else None."""
        if self.user is not None:
            pair = f"{self.user}:{self.password or ''}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        key = api_key()
        return f"Bearer {key}" if key else None


@dataclass(frozen=True)
class Http:
    """One server's base URL and how patiently to talk to it."""

    base_url: str
    timeout: float = 600.0  # seconds for the whole answer to one request, retries included
    retries: int = 3  # extra attempts after a retryable failure
    backoff: float = 0.5  # seconds before the first retry; doubles each time
    origin: Origin = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not 0 < self.timeout <= MAX_TIMEOUT:  # a socket's timeout overflows (inf, 1e300)
            raise KolibriError(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], "
                               f"got {self.timeout:g}")
        object.__setattr__(self, "origin", Origin.parse(self.base_url))

    def get(self, path: str, timeout: float | None = None, max_bytes: int = BODY_BYTES):
        return self.request("GET", path, None, timeout, max_bytes)

    def post(self, path: str, body: dict, timeout: float | None = None,
             max_bytes: int = BODY_BYTES):
        return self.request("POST", path, body, timeout, max_bytes)

    def get_text(self, path: str, timeout: float | None = None,
                 max_bytes: int = BODY_BYTES) -> str:
        raw = self._attempts("GET", path, None, timeout, max_bytes)
        return raw.decode("utf-8", "replace")

    def request(self, method: str, path: str, body: dict | None, timeout: float | None,
                max_bytes: int = BODY_BYTES):
        return self._parse(self._attempts(method, path, body, timeout, max_bytes), path)

    def where(self, path: str) -> str:
        return masked(self.base_url.rstrip("/") + path)

    def _attempts(self, method, path, body, timeout, max_bytes: int) -> bytes:
        seconds = timeout or self.timeout
        deadline = time.monotonic() + seconds
        attempt = 0
        while True:
            try:
                return self._once(method, path, body, deadline, max_bytes)
            except _Deadline:
                raise self._timeout(path, seconds) from None
            except _Retryable as e:
                reason = e.reason
            wait = self.backoff * 2**attempt
            attempt += 1
            if attempt > self.retries or time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
        raise KolibriError(f"{self.where(path)}: {reason} (tried {attempt} "
                           f"time{'s' if attempt > 1 else ''}); is the server running at that "
                           "address?")

    def _once(self, method: str, path: str, body: dict | None, deadline: float,
              max_bytes: int) -> bytes:
        connection, response = _connection(self.origin, deadline), None
        try:
            connection.request(method, self.origin.prefix + path, _encoded(body),
                               self._headers(body))
            response = connection.getresponse()
            if not 200 <= response.status < 300:
                raise self._status_error(response, path)
            return self._body(response, path, max_bytes)
        except (_Deadline, TimeoutError):
            raise _Deadline() from None
        except ssl.SSLCertVerificationError as e:
            raise KolibriError(f"{self.where(path)}: the server's TLS certificate is not trusted "
                               f"({clean(e.verify_message or e)})") from None
        except (ConnectionError, http.client.HTTPException, ssl.SSLError) as e:
            raise _Retryable(_reason(e)) from None
        except OSError as e:  # unknown host, network unreachable
            raise _Retryable(_reason(e)) from None
        finally:
            if response is not None:
                response.close()
            connection.close()

    def _headers(self, body: dict | None) -> dict:
        headers = {"Accept": "application/json", "Connection": "close"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if auth := self.origin.authorization():
            headers["Authorization"] = auth
        return headers

    def _body(self, response, path: str, max_bytes: int) -> bytes:
        """The whole body, or a KolibriError as soon as it is seen to pass `max_bytes`."""
        if response.length is not None and response.length > max_bytes:  # its Content-Length
            raise self._too_large(path, max_bytes)
        data = response.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise self._too_large(path, max_bytes)
        return data

    def _too_large(self, path: str, max_bytes: int) -> KolibriError:
        return KolibriError(f"{self.where(path)}: the answer is larger than {_size(max_bytes)}, "
                            "more than this request can need; is this the server's base URL?")

    def _timeout(self, path: str, timeout: float) -> KolibriError:
        return KolibriError(f"{self.where(path)}: no answer within {timeout:g} s; a slow server "
                            "needs a longer --timeout")

    def _status_error(self, response, path: str) -> Exception:
        code = response.status
        if 300 <= code < 400:
            location = clean(redacted(masked(response.getheader("Location") or "nowhere")))
            return KolibriError(f"{self.where(path)}: HTTP {code}, a redirect to "
                                f"{location[:120]}; kolibri sends requests (and the API key) "
                                "to the URL given only: pass the server's own URL")
        detail = _error_detail(response.read(ERROR_BYTES))
        if code in RETRY_STATUSES:
            return _Retryable(f"HTTP {code}{detail}")
        if code in (401, 403):
            return KolibriError(f"{self.where(path)}: HTTP {code}, not authorized{detail}; set "
                                "KOLIBRI_API_KEY (or OPENAI_API_KEY) to the server's key")
        if code == 404:
            return KolibriError(f"{self.where(path)}: HTTP 404, no such endpoint; is this the "
                                "server's base URL, and the right --engine-api?")
        return KolibriError(f"{self.where(path)}: HTTP {code}{detail}")

    def _parse(self, raw: bytes, path: str):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            text = redacted(raw[:80].decode("utf-8", "replace").replace("\n", " "))
            raise KolibriError(f"{self.where(path)}: the answer is not JSON ({shown(text, 90)}"
                               "...)") from None
        except (ValueError, RecursionError):  # a 4300+-digit number; nesting too deep
            raise KolibriError(f"{self.where(path)}: the answer is JSON no server sends (a "
                               "number of 4,300+ digits or nesting ~1,000 deep)") from None


# ---- sockets under one deadline ---------------------------------------------------------------


class _DeadlineSocket:
    """A connected socket whose every send and read waits only until `deadline` (monotonic).
    As socket.makefile's files do, a reader keeps it open until the reader is closed too
    (http.client closes the connection before the body of a `Connection: close` answer is
    read)."""

    def __init__(self, sock, deadline: float):
        self._sock, self._deadline = sock, deadline
        self._readers, self._closing = 0, False

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _Deadline()
        self._sock.settimeout(left)

    def sendall(self, data) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer) -> int:
        self._arm()
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args, **kwargs):
        self._readers += 1
        return io.BufferedReader(_Reader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closing and not self._readers:
            self._sock.close()

    def close(self) -> None:
        self._closing = True
        if not self._readers:
            self._sock.close()

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


class _DeadlineConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float, **kwargs):
        super().__init__(host, port, timeout=_left(deadline), **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = _left(self._deadline)  # connecting (and a TLS handshake) waits this long
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self._deadline)


class _DeadlineHttpsConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


def _connection(origin: Origin, deadline: float) -> http.client.HTTPConnection:
    if origin.scheme == "https":
        return _DeadlineHttpsConnection(origin.host, origin.port, deadline,
                                        context=ssl.create_default_context())
    return _DeadlineConnection(origin.host, origin.port, deadline)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Deadline()
    return left


# ---- messages ---------------------------------------------------------------------------------


def _encoded(body: dict | None) -> bytes | None:
    return None if body is None else json.dumps(body).encode()


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n / 1024:.0f} KB"


def _reason(reason) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    text = str(getattr(reason, "strerror", None) or reason) or type(reason).__name__
    return clean(redacted(text))[:200]


def _error_detail(raw: bytes) -> str:
    """`: message` from an OpenAI/llama.cpp-style JSON error body, else a short text excerpt."""
    text = redacted(raw.decode("utf-8", "replace").strip())
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return f": {clean(text[:120])}" if text else ""
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message:
        return ""
    return f": {clean(message[:200])}"
