"""Open a model by name or folder: resolve it through the cache (pulling the default model on
first use), check a cached model's files against what was written, then load it; or, where
kolibri only tokenizes, open just what tokenizes (`open_tokenizer`)."""

from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.engine.model import Model, TokenizerOnly, has_weights, load_model, tokenizer_folder
from kolibri_cli.errors import KolibriError
from kolibri_cli.store import cache, digests, integrity


def open_model(spec: str | None = None, notify=None, progress=None, weights: bool = True,
               numerics: str | None = None, compiling=None, kernels=None,
               preparing=None) -> Model:
    """`numerics`: one of engine.weights.STORAGE, None = the model's default
    (engine.model.folder_numerics); `compiling`: a `callbacks.Compiling` told of every compile
    the kernel's warm-up takes; `kernels`: the specializations it warms, `preparing` (a
    `callbacks.Preparing`) told of each (engine.model.load_model)."""
    model = _open(spec, notify, progress, weights, numerics, (compiling, kernels, preparing))
    model.digest = digests.files_sha256  # a user's folder is not read whole on every run
    return model


def open_tokenizer(spec: str | None = None, notify=None, progress=None) -> Model | TokenizerOnly:
    """What tokenizes for `spec` where kolibri only tokenizes: a GGUF file's metadata (its
    tensors are not read and nothing is imported), a folder of tokenizer files without weights,
    else the model (a cached one, pulled on first use, or a folder with weights) without its
    weights, identified by their sha256 as before."""
    path = Path(spec).expanduser() if spec else None
    if path is not None and path.is_file() and path.suffix.lower() == ".gguf":
        from kolibri_cli.store.vocabulary import gguf_tokenizer

        return gguf_tokenizer(path)
    if path is not None and spec not in cache.REGISTRY and path.is_dir() \
            and not cache.provenance(path) and not has_weights(path):
        return tokenizer_folder(path, spec)
    return open_model(spec, notify, progress, weights=False)


def check_runs_here(spec: str | None) -> None:
    """The error a load would end in that shows without loading: a folder given as the model
    that holds no weights (a server says it before it opens its port)."""
    from kolibri_cli.engine.loader import no_weights

    if spec and spec not in cache.REGISTRY and Path(spec).is_dir() and not has_weights(spec):
        raise no_weights(Path(spec))


def _open(spec, notify, progress, weights: bool, numerics: str | None, warm: tuple) -> Model:
    ahead = _compile_ahead(spec, numerics, *warm[::2]) if weights else None
    path = cache.resolve(spec, notify, progress)
    if ahead:
        ahead.wait()  # then the warm-up below loads the kernel from numba's cache
    meta = cache.provenance(path)
    name = cache.display_name(spec, meta)
    if not meta:  # a user's folder: its errors are about that folder
        return load_model(path, name, "", notify, weights, numerics, *warm)
    integrity.check_sizes(path, name, meta)
    if notify and not cache.noted_float32(spec, path) and (
            note := integrity.unrecorded_note(name, meta)):
        notify(note)
    try:
        return load_model(path, name, meta.get("gguf_sha256", ""), notify, weights, numerics,
                          *warm)
    except KolibriError as e:  # the cache wrote a loadable folder: this one was changed since
        raise KolibriError(f"{e}; the cached model may be damaged: check it with "
                           f"`kolibri model verify {name}`, rewrite it with "
                           f"`{integrity.repair_hint(name, meta)}`") from None


def _compile_ahead(spec, numerics: str | None, compiling, preparing=None):
    """A registry model about to be pulled: the lean kernel of the numeric path it will run
    (its default unless asked) compiled meanwhile, in child processes."""
    from kolibri_cli.engine import simd8
    from kolibri_cli.engine.weights import INTEGER_PATHS, default_numerics, kernel_types
    from kolibri_cli.store import precompile

    source = cache.REGISTRY.get(spec or cache.DEFAULT_MODEL)
    if (source is None or not source.kernel_types or cache.offline()
            or cache.is_complete(cache.model_dir(spec or cache.DEFAULT_MODEL))):
        return None
    numerics = numerics or default_numerics(source.kernel_types)
    if numerics != "float32" and numerics not in INTEGER_PATHS:
        return None  # q8_0's types are made at load: its kernel compiles in the foreground
    if numerics == "int16" and not simd8.F16C:
        return None  # refused at load (engine.model.load_weights): nothing to compile
    if preparing:
        from kolibri_cli.engine.kernel import KERNEL_WORDS

        preparing(KERNEL_WORDS["lean"], 0, 1)
    return precompile.start(kernel_types(source.kernel_types, numerics), compiling)


def default_numerics_of(spec: str | None) -> str:
    """The numeric path `spec` (a cached model's name or a folder) runs without --quantize,
    known without loading or pulling it: from its stored block types, or a registry model's
    declared ones; float32 where neither is here."""
    from kolibri_cli.engine.model import folder_numerics
    from kolibri_cli.engine.weights import default_numerics

    name = spec or cache.DEFAULT_MODEL
    cached = cache.model_dir(name) if cache.NAME_PATTERN.fullmatch(name) else None
    if cached is not None and cache.is_complete(cached):
        return folder_numerics(cached)
    if name not in cache.REGISTRY and Path(name).expanduser().is_dir():
        return folder_numerics(Path(name).expanduser())
    source = cache.REGISTRY.get(name)
    return default_numerics(source.kernel_types) if source else "float32"


@dataclass
class Verification:
    """`kolibri model verify`: every file a cached model recorded, checked against its sha256."""

    name: str
    path: str
    files: list[integrity.FileCheck]
    unrecorded: list[str]  # files in the folder kolibri did not write (not checked)
    repair: str  # the command that rewrites the model

    @property
    def damaged(self) -> list[integrity.FileCheck]:
        return [f for f in self.files if not f.ok]

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "ok": not self.damaged,
                "files": [f.to_dict() for f in self.files], "unrecorded": self.unrecorded,
                "repair": self.repair}


def verify(spec: str | None = None, progress=None) -> Verification:
    """Read every recorded file of the cached model `spec` whole; nothing is pulled."""
    path = cache.resolve(spec, pull_missing=False)
    meta = cache.provenance(path)
    name = cache.display_name(spec, meta)
    if not meta:
        raise KolibriError(f"{path} is not a model in the kolibri cache (no kolibri.json); "
                           "verify checks cached models against what kolibri wrote")
    files = integrity.recorded(meta, name)
    if files is None:
        raise KolibriError(integrity.unrecorded_note(name, meta).removeprefix("note: "))
    checks = integrity.verify_files(path, files, progress)
    extra = [f for f in integrity.folder_files(path) if f not in files]
    return Verification(name, str(path), checks, extra, integrity.repair_hint(name, meta))


def verify_hint(model) -> str:
    """Where a divergence may come from damaged cached weights, the command that checks them."""
    if not model.source_sha256:  # a user's folder: kolibri recorded nothing to compare with
        return ""
    return (f"; if {model.name} should reproduce them, check its cached files with "
            f"`kolibri model verify {model.name}`")
