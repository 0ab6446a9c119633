"""A loaded model: config + tokenizer + the forward kernel, and what identifies it."""

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kolibri_cli.engine import loader
from kolibri_cli.engine.config import ModelConfig, generation_eos
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.engine.weights import Weights, layout


@dataclass
class Model:
    name: str  # registry name, or the folder path as given
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    weights: Weights | None  # None: opened for its tokenizer only (a remote engine runs it)
    source_sha256: str  # of the GGUF a cache model was converted from; "" for user folders

    @cached_property
    def sha256(self) -> str:
        """Identifies the weights goldens were recorded from: the source GGUF's sha256, else
        the sha256 over the folder's safetensors files (read once, on demand)."""
        return self.source_sha256 or loader.sha256_files(loader.safetensors_files(self.path))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @cached_property
    def transformer(self):
        from kolibri_cli.engine.kernel import Transformer

        return Transformer(self.config, self.weights)


def load_model(path: Path, name: str, source_sha256: str = "", notify=None,
               weights: bool = True) -> Model:
    """The model in a Hugging Face-layout folder, its kernel compiled (or loaded) and warm;
    `weights=False`: config and tokenizer only (what a remote engine's client needs)."""
    path = loader.check_folder(path)
    config = generation_eos(path, ModelConfig.from_file(path / "config.json"))
    model = Model(name=name, path=path, config=config, tokenizer=Tokenizer(path),
                  weights=layout(config, loader.load_tensors(path, config)) if weights else None,
                  source_sha256=source_sha256)
    if not weights:
        return model
    from kolibri_cli.engine.kernel import is_compiled

    if notify and not is_compiled():
        notify("compiling the forward kernel (first run only, seconds) ...")
    model.transformer.warm_up()
    return model
