"""A loaded model: config + tokenizer + the forward kernel, and what identifies it."""

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kolibri_cli import loader, store
from kolibri_cli.config import ModelConfig
from kolibri_cli.tokenizer import Tokenizer
from kolibri_cli.weights import Weights, layout


@dataclass
class Model:
    name: str  # registry name, or the folder path as given
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    weights: Weights
    source_sha256: str  # of the GGUF a cache model was converted from; "" for user folders

    @cached_property
    def sha256(self) -> str:
        """Identifies the weights goldens were recorded from: the source GGUF's sha256, else
        the sha256 over the folder's safetensors files (read once, on demand)."""
        if self.source_sha256:
            return self.source_sha256
        h = hashlib.sha256()
        for f in loader.safetensors_files(self.path):
            with open(f, "rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
        return h.hexdigest()

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @cached_property
    def transformer(self):
        from kolibri_cli.kernel import Transformer

        return Transformer(self.config, self.weights)


def load_model(spec: str | None = None, notify=None, progress=None) -> Model:
    path = loader.check_folder(store.resolve(spec, notify, progress))
    config = ModelConfig.from_file(path / "config.json")
    tokenizer = Tokenizer(path)
    weights = layout(config, loader.load_tensors(path, config))
    meta = store.provenance(path)
    model = Model(
        name=store.display_name(spec, meta),
        path=path,
        config=config,
        tokenizer=tokenizer,
        weights=weights,
        source_sha256=meta.get("gguf_sha256", ""),
    )
    from kolibri_cli.kernel import is_compiled

    if notify and not is_compiled():
        notify("compiling the forward kernel (first run only, seconds) ...")
    model.transformer.warm_up()
    return model
