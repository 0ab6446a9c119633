"""Inference servers as engines: llama.cpp's llama-server, vLLM, SGLang or any OpenAI-compatible
server at a URL, or a llama-server kolibri starts itself on the model's GGUF.

`--engine` takes `kolibri`, `transformers` (in-process, elsewhere), `llama-server` (started
here) or a base URL. Non-goals: running models (the servers do), rendering.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.servers.api import APIS, Completion, ServerApi, connect
from kolibri_cli.servers.launch import LlamaServer, ServerSpec, spec_args, synth_args

__all__ = ["APIS", "LOCAL", "Completion", "LlamaServer", "ServerApi", "ServerSpec",
           "connect", "is_server", "serving", "spec_args", "synth_args"]

LOCAL = "llama-server"  # --engine value: start a local llama-server


def is_server(engine: str) -> bool:
    return engine == LOCAL or engine.startswith(("http://", "https://"))


@contextmanager
def serving(engine: str, model, api: str | None = None, gguf: Path | None = None,
            threads: int | None = None, args: tuple[str, ...] = (), timeout: float = 600.0,
            served_model: str | None = None) -> Iterator[ServerApi]:
    """A client for `engine`: a URL is connected to as it is; `llama-server` is started on the
    model's GGUF (or `gguf`) with `args` (speculative flags) and stopped afterwards."""
    if engine == LOCAL:
        from kolibri_cli.store.cache import gguf_file

        spec = ServerSpec(Path(gguf) if gguf else gguf_file(model.path),
                          threads or os.cpu_count() or 1, args=tuple(args))
        with LlamaServer(spec) as server:
            api = connect(server.url, "llama.cpp", model.tokenizer, model.eos_ids, timeout,
                          vocab=model.config.vocab_size)
            api.local_version = server.version()
            yield api
        return
    if not is_server(engine):
        raise KolibriError(f"engine {engine!r} is not a server: use llama-server or a base URL "
                           "(http://host:port)")
    yield connect(engine, api, model.tokenizer, model.eos_ids, timeout, served_model,
                  model.config.vocab_size)
