"""A loaded model: config + tokenizer + the forward kernel, and what identifies it; and a model
known by its tokenizer only (`TokenizerOnly`), whose weights a server runs or that kolibri only
tokenizes for.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kolibri_cli.callbacks import Compiling, Preparing
from kolibri_cli.engine import blockfile, blocks, loader, simd8
from kolibri_cli.engine.config import (
    ModelConfig,
    eos_token_ids,
    generation_eos,
    generation_eos_ids,
)
from kolibri_cli.engine.jit import compile_events
from kolibri_cli.engine.tokenizer import Tokenizer, Tokenizes
from kolibri_cli.engine.weights import (
    INTEGER_PATHS,
    STORAGE,
    Weights,
    default_numerics,
    layout,
)
from kolibri_cli.errors import KolibriError


@dataclass(frozen=True)
class Identity:
    """What identifies the model that made a golden's ids, and what a model is matched by: the
    weights' sha256 where kolibri has them, else the tokenizer's; a server's name for its model
    and its fingerprint where a server made (or tokenized) them. "" = not known."""

    model_sha256: str = ""  # the weights' (the source GGUF's, or the safetensors files')
    tokenizer_sha256: str = ""  # a tokenizer-only model's: its files, or a GGUF's metadata
    served_model: str = ""  # the model name a server reports
    fingerprint: str = ""  # a server's own mark of its weights, where it reports one

    GOLDEN_KEYS = ("tokenizer_sha256", "served_model", "fingerprint")  # a golden's "identity"

    def to_dict(self) -> dict[str, str]:
        """The golden's "identity" object (model_sha256 is a field of its own)."""
        return {key: getattr(self, key) for key in self.GOLDEN_KEYS if getattr(self, key)}

    def merged(self, other: "Identity") -> "Identity":
        """This identity with what `other` knows added (its non-empty fields win)."""
        return dataclasses.replace(self, **{k: v for k, v in vars(other).items() if v})

    def conflict(self, other: "Identity") -> str | None:
        """The first field both know and that differs, else None."""
        return next((key for key, ours in vars(self).items()
                     if ours and getattr(other, key) and ours != getattr(other, key)), None)


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
    # Q4_1/Q8_0 blocks times int8-quantized activations, integer dots (weights.int8_weights);
    # "int16": the same with int16-quantized activations (weights.int16_weights), the default
    # where it runs (weights.default_numerics)
    digest: Callable[[list[Path]], str] = field(default=loader.sha256_files, repr=False)
    # sha256 over weight files; the store gives one that remembers digests (store/digests.py)

    @cached_property
    def sha256(self) -> str:
        """Identifies the weights goldens were recorded from: the source GGUF's sha256, else
        the sha256 over the folder's weight files (read once, on demand)."""
        index = self.path / blockfile.NAME
        files = (blockfile.data_files(index) if index.is_file()
                 else loader.safetensors_files(self.path))
        return self.source_sha256 or self.digest(files)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def identity(self) -> Identity:
        return Identity(model_sha256=self.sha256)

    @cached_property
    def transformer(self):
        from kolibri_cli.engine.kernel import Transformer

        return Transformer(self.config, self.weights)


def folder_numerics(path: Path) -> str:
    """The numeric path the model folder runs when none is asked for (`weights.default_numerics`
    of its block file's matrices; a folder of float tensors: float32), from the index alone."""
    index = Path(path) / blockfile.NAME
    if not index.is_file():
        return "float32"
    matrices = [e for e in blockfile.read_index(index).values() if e.code is not None]
    return default_numerics({blocks.TYPES[e.code].name for e in matrices})


def load_weights(path: Path, config: ModelConfig, numerics: str) -> Weights:
    """A cache folder's block file, memory-mapped; else the folder's safetensors as float32 rows.
    numerics "q8_0": the float32 weights (a block file's decoded) quantized to Q8_0 instead;
    "int8"/"int16": the block file's Q4_1/Q8_0 matrices (float32 weights: quantized to Q8_0
    first) repacked for that integer path."""
    if numerics not in STORAGE:
        raise KolibriError(f"unknown numeric path {numerics!r} ({', '.join(STORAGE)})")
    index = path / blockfile.NAME
    if numerics == "int16" and not simd8.F16C:
        raise KolibriError("--quantize int16 needs a CPU with F16C (numba's target lacks it): "
                           "use --quantize int8 or --quantize float32")
    if numerics in INTEGER_PATHS:
        return INTEGER_PATHS[numerics](
            blockfile.load_weights(index, config) if index.is_file()
            else layout(config, loader.load_tensors(path, config), "q8_0"))
    if not index.is_file():
        return layout(config, loader.load_tensors(path, config), numerics)
    if numerics == "float32":
        return blockfile.load_weights(index, config)
    return layout(config, blockfile.float_tensors(index), numerics)


def load_model(path: Path, name: str, source_sha256: str = "", notify=None,
               weights: bool = True, numerics: str | None = None,
               compiling: Compiling | None = None, kernels=None,
               preparing: Preparing | None = None) -> Model:
    """The model in a model folder, its kernel compiled (or loaded) and warm; `weights=False`:
    config and tokenizer only (what a remote engine's client needs). `numerics`: one of STORAGE,
    None = the folder's default (`folder_numerics`). `kernels`: the kernel's specializations to
    warm (Transformer.warm_up; default all), the others compile when first used. `compiling` is
    told of each function numba compiles for the warm-up (none when its cache has them),
    `preparing` of each specialization before it is compiled or loaded."""
    if weights and Path(path).is_dir() and not has_weights(path) \
            and (Path(path) / "tokenizer.json").is_file():
        raise loader.no_weights(path)  # a tokenizer-only folder: say so before its config
    path = loader.check_folder(path)
    config = generation_eos(path, ModelConfig.from_file(path / "config.json"))
    numerics = numerics or folder_numerics(path)
    model = Model(name=name, path=path, config=config, tokenizer=Tokenizer(path),
                  weights=load_weights(path, config, numerics) if weights else None,
                  source_sha256=source_sha256, numerics=numerics)
    if not weights:
        return model
    from kolibri_cli.engine.jitcache import distrusted, numba_root
    from kolibri_cli.engine.kernel import KERNELS, compiles_in_memory, is_compiled

    if notify and compiles_in_memory() and (why := distrusted()):
        notify(f"compiling the forward kernel in memory, as on every run: {why}, so no "
               f"compiled code is loaded from {numba_root()} ...")
    elif notify and compiles_in_memory():
        notify(f"compiling the forward kernel in memory, as on every run: no cache folder can "
               f"be made under {numba_root()} (KOLIBRI_HOME or NUMBA_CACHE_DIR names it) ...")
    elif notify and not is_compiled():
        notify("compiling the forward kernel for this machine (first run only) ...")
    with compile_events(compiling):
        model.transformer.warm_up(kernels or KERNELS, preparing)
    return model


@dataclass
class TokenizerOnly:
    """A model kolibri knows by its tokenizer only: a folder of tokenizer files, a GGUF's
    metadata, or a server's own tokenizer. Enough to record and import goldens and to measure on
    a server; nothing here runs it."""

    name: str
    tokenizer: Tokenizes
    vocab_size: int | None  # V: ids must stay below it (None: not known, a vLLM server)
    context: int | None  # positions a prompt and its output may take (None: not known)
    eos_ids: tuple[int, ...]
    identity: Identity
    path: Path | None = None  # the folder or GGUF file (None: a server)
    weights: None = None
    numerics: None = None  # no numeric path of kolibri's: the goldens' numerics are not checked
    source_sha256: str = ""

    @property
    def sha256(self) -> str:
        """The weights' sha256, which a tokenizer-only model does not know."""
        return self.identity.model_sha256


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def has_weights(folder: Path) -> bool:
    """A weights index (or an earlier layout's block file), a safetensors index or any
    *.safetensors file."""
    folder = Path(folder)
    return ((folder / blockfile.NAME).is_file() or (folder / blockfile.LEGACY).is_file()
            or (folder / loader.INDEX).is_file()
            or any(folder.glob("*.safetensors")))


def tokenizer_folder(path: Path, name: str) -> TokenizerOnly:
    """A folder's tokenizer files (tokenizer.json; tokenizer_config.json, chat_template.jinja,
    config.json and generation_config.json where present), of any architecture."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise KolibriError(f"{path} has no tokenizer.json: a tokenizer-only model is a folder "
                           "with the model's tokenizer.json and tokenizer_config.json")
    tokenizer = Tokenizer(path)
    config = loader.read_json_object(path / "config.json") \
        if (path / "config.json").is_file() else {}
    files = [path / f for f in TOKENIZER_FILES if (path / f).is_file()]
    return TokenizerOnly(
        name=name, tokenizer=tokenizer, path=path,
        vocab_size=_count(config, "vocab_size", path) or tokenizer.vocab_size,
        context=_count(config, "max_position_embeddings", path),
        eos_ids=generation_eos_ids(path) or _eos_ids(config, tokenizer, path),
        identity=Identity(tokenizer_sha256=loader.sha256_files(files)))


def _count(config: dict, key: str, path: Path) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KolibriError(f"{path / 'config.json'}: {key} must be a whole number >= 1")
    return value


def _eos_ids(config: dict, tokenizer: Tokenizer, path: Path) -> tuple[int, ...]:
    """config.json's eos ids, else the id of tokenizer_config.json's eos_token."""
    try:
        ids = eos_token_ids(config)
    except ValueError as e:
        raise KolibriError(f"{path / 'config.json'}: {e}") from None
    eos = tokenizer.special_tokens().get("eos_token")
    found = None if eos is None else tokenizer.token_to_id(eos)
    return ids or (() if found is None else (found,))
