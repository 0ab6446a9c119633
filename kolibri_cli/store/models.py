"""Open a model by name or folder: resolve it through the cache (pulling the default model on
first use), then load it."""

from kolibri_cli.engine.model import Model, load_model
from kolibri_cli.store import cache


def open_model(spec: str | None = None, notify=None, progress=None) -> Model:
    path = cache.resolve(spec, notify, progress)
    meta = cache.provenance(path)
    return load_model(path, cache.display_name(spec, meta), meta.get("gguf_sha256", ""), notify)
