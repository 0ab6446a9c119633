"""JSON over HTTP to an inference server: timeouts, retries with backoff, one-line errors.

A bearer key is read from KOLIBRI_API_KEY (else OPENAI_API_KEY) and never appears in a message;
credentials written into a URL are masked too. Connection failures and the statuses a busy or
loading server answers (429, 502, 503, 504) are retried; anything else fails at once.
Non-goals: streaming, concurrency (timing needs one request at a time).
"""

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from kolibri_cli.errors import KolibriError

API_KEY_VARS = ("KOLIBRI_API_KEY", "OPENAI_API_KEY")
RETRY_STATUSES = frozenset({429, 502, 503, 504})


class _Retryable(Exception):
    """A failure worth another attempt; `reason` is the user-facing explanation."""

    def __init__(self, reason: str):
        self.reason = reason


def api_key() -> str | None:
    return next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), None)


def redacted(text: str) -> str:
    """`text` with the API key replaced (a server may echo it in an error)."""
    key = api_key()
    return text.replace(key, "***") if key else text


def masked(url: str) -> str:
    """`url` without user:password (what messages show)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


MAX_TIMEOUT = 1e6  # seconds (11 days); a socket's timeout overflows past ~1e11 (inf included)


@dataclass(frozen=True)
class Http:
    """One server's base URL and how patiently to talk to it."""

    base_url: str
    timeout: float = 600.0  # seconds for one request (a long generation on a big model)
    retries: int = 3  # extra attempts after a retryable failure
    backoff: float = 0.5  # seconds before the first retry; doubles each time

    def __post_init__(self):
        if not 0 < self.timeout <= MAX_TIMEOUT:  # a socket's timeout overflows (inf, 1e300)
            raise KolibriError(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], "
                               f"got {self.timeout:g}")

    def get(self, path: str, timeout: float | None = None):
        return self.request("GET", path, None, timeout)

    def post(self, path: str, body: dict, timeout: float | None = None):
        return self.request("POST", path, body, timeout)

    def get_text(self, path: str, timeout: float | None = None) -> str:
        return self._attempts("GET", path, None, timeout, parse=False)

    def request(self, method: str, path: str, body: dict | None, timeout: float | None):
        return self._attempts(method, path, body, timeout, parse=True)

    def where(self, path: str) -> str:
        return masked(self.base_url.rstrip("/") + path)

    def _attempts(self, method, path, body, timeout, parse: bool):
        for attempt in range(self.retries + 1):
            try:
                raw = self._once(method, path, body, timeout or self.timeout)
                return self._parse(raw, path) if parse else raw.decode("utf-8", "replace")
            except _Retryable as e:
                reason = e.reason
                if attempt < self.retries:
                    time.sleep(self.backoff * 2**attempt)
        raise KolibriError(f"{self.where(path)}: {reason} (tried {self.retries + 1} times); is the "
                           "server running at that address?")

    def _once(self, method: str, path: str, body: dict | None, timeout: float) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key := api_key():
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data, headers,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            raise self._status_error(e, path) from None
        except TimeoutError:
            raise self._timeout(path, timeout) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise self._timeout(path, timeout) from None
            raise _Retryable(_reason(e.reason)) from None
        except (ConnectionError, http.client.HTTPException) as e:
            raise _Retryable(_reason(e)) from None

    def _timeout(self, path: str, timeout: float) -> KolibriError:
        return KolibriError(f"{self.where(path)}: no answer within {timeout:g} s; a slow server "
                            "needs a longer --timeout")

    def _status_error(self, e: urllib.error.HTTPError, path: str) -> Exception:
        detail = _error_detail(e.read())
        if e.code in RETRY_STATUSES:
            return _Retryable(f"HTTP {e.code}{detail}")
        if e.code in (401, 403):
            return KolibriError(f"{self.where(path)}: HTTP {e.code}, not authorized{detail}; set "
                                "KOLIBRI_API_KEY (or OPENAI_API_KEY) to the server's key")
        if e.code == 404:
            return KolibriError(f"{self.where(path)}: HTTP 404, no such endpoint; is this the "
                                "server's base URL, and the right --engine-api?")
        return KolibriError(f"{self.where(path)}: HTTP {e.code}{detail}")

    def _parse(self, raw: bytes, path: str):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            text = redacted(raw[:80].decode("utf-8", "replace").replace("\n", " "))
            raise KolibriError(f"{self.where(path)}: the answer is not JSON ({text!r}...)"
                               ) from None


def _reason(reason) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    return str(getattr(reason, "strerror", None) or reason) or type(reason).__name__


def _error_detail(raw: bytes) -> str:
    """`: message` from an OpenAI/llama.cpp-style JSON error body, else a short text excerpt."""
    text = redacted(raw.decode("utf-8", "replace").strip())
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return f": {text[:120]}" if text else ""
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    message = error.get("message") if isinstance(error, dict) else error
    return f": {str(message)[:200]}" if message else ""
