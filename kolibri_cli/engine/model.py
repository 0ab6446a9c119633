"""A loaded model: config + tokenizer + the forward kernel, and what identifies it."""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kolibri_cli.engine import blockfile, loader
from kolibri_cli.engine.config import ModelConfig, generation_eos
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.engine.weights import STORAGE, Weights, int8_weights, layout
from kolibri_cli.errors import KolibriError


@dataclass
class Model:
    name: str  # registry name, or the folder path as given
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    weights: Weights | None  # None: opened for its tokenizer only (a remote engine runs it)
    source_sha256: str  # of the GGUF a cache model was converted from; "" for user folders
    numerics: str = "float32"  # "float32": the float32 path on the stored values (GGUF blocks
    # decode to them exactly); "q8_0": the float32 weights quantized to Q8_0 at load; "int8":
    # Q4_1/Q8_0 blocks times int8-quantized activations, integer dots (weights.int8_weights)
    digest: Callable[[list[Path]], str] = field(default=loader.sha256_files, repr=False)
    # sha256 over weight files; the store gives one that remembers digests (store/digests.py)

    @cached_property
    def sha256(self) -> str:
        """Identifies the weights goldens were recorded from: the source GGUF's sha256, else
        the sha256 over the folder's weight files (read once, on demand)."""
        blocks = self.path / blockfile.NAME
        files = [blocks] if blocks.is_file() else loader.safetensors_files(self.path)
        return self.source_sha256 or self.digest(files)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @cached_property
    def transformer(self):
        from kolibri_cli.engine.kernel import Transformer

        return Transformer(self.config, self.weights)


def load_weights(path: Path, config: ModelConfig, numerics: str = "float32") -> Weights:
    """A cache folder's block file, memory-mapped; else the folder's safetensors as float32 rows.
    numerics "q8_0": the float32 weights (a block file's decoded) quantized to Q8_0 instead;
    "int8": the block file's Q4_1/Q8_0 matrices (float32 weights: quantized to Q8_0 first)
    repacked for the int8 path."""
    if numerics not in STORAGE:
        raise KolibriError(f"unknown numeric path {numerics!r} ({', '.join(STORAGE)})")
    blocks = path / blockfile.NAME
    if numerics == "int8":
        return int8_weights(blockfile.load_weights(blocks, config) if blocks.is_file()
                            else layout(config, loader.load_tensors(path, config), "q8_0"))
    if not blocks.is_file():
        return layout(config, loader.load_tensors(path, config), numerics)
    if numerics == "float32":
        return blockfile.load_weights(blocks, config)
    return layout(config, blockfile.float_tensors(blocks), numerics)


def load_model(path: Path, name: str, source_sha256: str = "", notify=None,
               weights: bool = True, numerics: str = "float32") -> Model:
    """The model in a model folder, its kernel compiled (or loaded) and warm; `weights=False`:
    config and tokenizer only (what a remote engine's client needs)."""
    path = loader.check_folder(path)
    config = generation_eos(path, ModelConfig.from_file(path / "config.json"))
    model = Model(name=name, path=path, config=config, tokenizer=Tokenizer(path),
                  weights=load_weights(path, config, numerics) if weights else None,
                  source_sha256=source_sha256, numerics=numerics)
    if not weights:
        return model
    from kolibri_cli.engine.kernel import is_compiled

    if notify and not is_compiled():
        notify("compiling the forward kernel (first run only; 2-3 minutes on 2 cores) ...")
    model.transformer.warm_up()
    return model
