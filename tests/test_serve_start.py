"""`kolibri serve`'s start, in-process on a tiny model: the port opens before the model loads,
and until it is ready every route but /version answers 503 with llama-server's "Loading model"
error (and Retry-After), then 200; a load that fails stops the server and is raised."""

import http.client
import json
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from kolibri_cli.errors import KolibriError  # noqa: E402
from kolibri_cli.serve import run  # noqa: E402

WAIT_S = 900  # bounded waits: the tiny kernel may compile on a cold cache (minutes on 2 cores)


def _get(url: str, path: str) -> tuple[int, object, dict]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.headers, json.loads(response.read())


class _Serving:
    """run.serve on its own thread with `load`; its uvicorn server kept to stop it."""

    def __init__(self, monkeypatch, load):
        self.servers, self.listening, self.ready = [], threading.Event(), threading.Event()
        self.url, self.failed = "", None
        made = run._Server.__init__

        def keep(server, *args) -> None:
            made(server, *args)
            self.servers.append(server)

        monkeypatch.setattr(run._Server, "__init__", keep)
        cfg = run.ServeConfig(port=0, spec=False, threads=1, drain_s=0.0)
        self.thread = threading.Thread(target=self._serve, args=(load, cfg), daemon=True)
        self.thread.start()
        assert self.listening.wait(WAIT_S)

    def _serve(self, load, cfg) -> None:
        def listening(url: str) -> None:
            self.url = url
            self.listening.set()

        try:
            run.serve(load, cfg, listening, lambda url, model: self.ready.set(),
                      lambda entry: None, lambda line: None)
        except BaseException as e:  # noqa: BLE001 - looked at by the test
            self.failed = e
        self.listening.set()
        self.ready.set()  # ended: nobody waits for a server that is gone

    def stop(self) -> None:
        self.servers[0].should_exit = True
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()


def test_the_port_answers_503_loading_until_the_model_is_ready(monkeypatch, tiny_llama_folder):
    from kolibri_cli.store.models import open_model

    folder, go = tiny_llama_folder(), threading.Event()

    def load(stage):
        stage("compiling or loading the kernel (1 of 3)")
        assert go.wait(WAIT_S)
        return open_model(str(folder))

    serving = _Serving(monkeypatch, load)
    try:
        for path in ("/health", "/v1/models", "/metrics"):
            status, headers, body = _get(serving.url, path)
            assert status == 503 and headers["Retry-After"] == "1", path
            assert body["error"]["message"] == ("Loading model: compiling or loading the kernel "
                                                "(1 of 3); retry shortly")
            assert body["error"]["type"] == "unavailable_error"
        assert _get(serving.url, "/version")[0] == 200
        go.set()
        assert serving.ready.wait(WAIT_S) and serving.thread.is_alive(), serving.failed
        status, _, body = _get(serving.url, "/health")
        assert status == 200 and body == {"status": "ok"}
        status, _, models = _get(serving.url, "/v1/models")
        assert status == 200 and models["data"][0]["id"] == str(folder)
    finally:
        go.set()
        serving.stop()
    assert serving.failed is None


def test_a_load_that_fails_stops_the_server_and_is_raised(monkeypatch):
    def load(stage):
        raise KolibriError("no model named 'nope'")

    serving = _Serving(monkeypatch, load)
    serving.thread.join(WAIT_S)
    assert not serving.thread.is_alive()
    assert isinstance(serving.failed, KolibriError) and "nope" in str(serving.failed)
    with pytest.raises(OSError):  # the port is closed again
        _get(serving.url, "/health")
