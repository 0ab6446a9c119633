"""Inference servers as engines: llama.cpp's llama-server, vLLM, SGLang or any OpenAI-compatible
server at a URL, or a llama-server kolibri starts itself on the model's GGUF.

`--engine` takes `kolibri`, `transformers` (in-process, elsewhere), `llama-server` (started
here) or a base URL. Non-goals: running models (the servers do), rendering.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kolibri_cli.engine.model import TokenizerOnly
from kolibri_cli.engines.api import APIS, Completion, ServerApi, connect
from kolibri_cli.engines.launch import LlamaServer, ServerSpec, spec_args, synth_args
from kolibri_cli.engines.tokenizer import server_identity, server_model
from kolibri_cli.errors import KolibriError

__all__ = ["APIS", "LOCAL", "Completion", "LlamaServer", "ServerApi", "ServerSpec",
           "connect", "is_server", "server_identity", "server_model", "serving", "spec_args",
           "synth_args", "tokenizing_model"]

LOCAL = "llama-server"  # --engine value: start a local llama-server
SLOT_CONTEXT = 512  # KV positions each slot of a started llama-server holds at least


def is_server(engine: str) -> bool:
    return engine == LOCAL or engine.startswith(("http://", "https://"))


@contextmanager
def serving(engine: str, model, api: str | None = None, gguf: Path | None = None,
            threads: int | None = None, args: tuple[str, ...] = (), timeout: float = 600.0,
            served_model: str | None = None, slots: int = 1) -> Iterator[ServerApi]:
    """A client for `engine`: a URL is connected to as it is; `llama-server` is started on the
    model's GGUF (or `gguf`) with `args` (speculative flags) and `slots` (-np) and stopped
    afterwards."""
    if engine == LOCAL:
        spec = ServerSpec(_gguf(model, gguf), threads or os.cpu_count() or 1, args=tuple(args),
                          slots=slots, ctx=max(ServerSpec.ctx, SLOT_CONTEXT * slots))
        with LlamaServer(spec) as server:
            api = connect(server.url, "llama.cpp", model.tokenizer, model.eos_ids, timeout,
                          vocab=model.vocab_size)
            api.local_version = server.version()
            yield api
        return
    if not is_server(engine):
        raise KolibriError(f"engine {engine!r} is not a server: use llama-server or a base URL "
                           "(http://host:port)")
    yield connect(engine, api, model.tokenizer, model.eos_ids, timeout, served_model,
                  model.vocab_size)


def _gguf(model, given: Path | None) -> Path:
    """The GGUF a local llama-server runs: --gguf, the GGUF the model was opened from (its
    tokenizer read from its metadata), or the one a cached model came from."""
    from kolibri_cli.store.cache import gguf_file

    if given:
        return Path(given)
    path = Path(model.path) if model.path else None
    return path if path is not None and path.is_file() else gguf_file(model.path)


def tokenizing_model(spec: str | None, engine: str, api: str | None = None,
                     timeout: float = 600.0, served_model: str | None = None, notify=None,
                     progress=None):
    """The model whose tokenizer makes the ids of a run on `engine` (a server or None): `spec`
    read here where given (a folder, a GGUF's metadata, a cached model without its weights),
    else with a server URL the server's own tokenizer, else the default model. A server at a
    URL adds its name and fingerprint to the model's identity."""
    from kolibri_cli.store.models import open_tokenizer

    remote = engine is not None and is_server(engine) and engine != LOCAL
    if spec is None and remote:
        return server_model(connect(engine, api, timeout=timeout, served_model=served_model))
    model = open_tokenizer(spec, notify, progress)
    if not remote:
        return model
    server = connect(engine, api, model.tokenizer, model.eos_ids, timeout, served_model,
                     model.vocab_size)
    return TokenizerOnly(model.name, model.tokenizer, model.vocab_size, model.context,
                         tuple(model.eos_ids), model.identity.merged(server_identity(server)),
                         model.path)
