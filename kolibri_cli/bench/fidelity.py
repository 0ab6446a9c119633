"""How faithful a numeric path is, measured on greedy goldens of its model (the shipped ones, or a
file recorded with `kolibri goldens record --engine transformers`, e.g. on Spec-Bench prompts):
how many of their chains (the float32 transformers reference) it reproduces token for token, and
the largest absolute difference of any logit at any of their positions from the float32 path (the
model's stored values decoded exactly, which transformers on the dequantized weights matches).

Non-goals: sampled goldens (a path's greedy chains are what it changes), other models' goldens.
"""

from dataclasses import asdict, dataclass

import numpy as np

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import SHIPPED, Golden, load_goldens
from kolibri_cli.goldens.record import check_fits, check_one


@dataclass
class Fidelity:
    numerics: str  # the numeric path measured
    source: str  # "shipped", or the goldens file measured against
    references: list[str]  # the engines that recorded those goldens (e.g. ["transformers"])
    goldens: int  # greedy goldens of this model
    reproduced: int  # of them, chains equal token for token
    max_logit_diff: float  # largest |logit - float32 path's| over every golden position
    at: str  # the golden holding it

    def to_dict(self) -> dict:
        return asdict(self)


def teacher_forced(model, g: Golden) -> np.ndarray:
    """Logits [len(output), V] of every position of the golden's chain, in one forward"""
    ids = np.asarray(g.prompt_ids + g.output_ids[:-1], np.int64)
    tf = model.transformer
    return tf.forward(ids, 0, tf.new_cache(len(ids)))[len(g.prompt_ids) - 1:]


def measure_fidelity(model, reference, goldens: list[Golden], source: str = "shipped",
                     progress=None) -> Fidelity:
    """`model` on its numeric path against the greedy `goldens` and against `reference`, the
    same model on the float32 path (the model itself when it is on that path). `progress(n)` is
    called after each golden."""
    greedy = [g for g in goldens if not g.sampling]
    worst, at = 0.0, ""
    for g in greedy:
        if reference is not model:
            diff = float(np.abs(teacher_forced(model, g) - teacher_forced(reference, g)).max())
            worst, at = max((worst, at), (diff, str(g.id)))
    reproduced = 0
    for i, g in enumerate(greedy):
        reproduced += check_one(model, g).identical
        if progress:
            progress(i + 1)
    engines = sorted({g.reference.get("engine", "kolibri") for g in greedy})
    return Fidelity(model.numerics, source, engines, len(greedy), reproduced, worst, at)


def float32_reference(model, load_float32):
    """The model to measure `model` against: itself on the float32 path, else the same model on
    the float32 path, loaded by `load_float32()` (only then, since it is a second copy)."""
    return model if model.numerics == "float32" else load_float32()


def shipped_goldens(model) -> list[Golden]:
    """The greedy goldens shipped for this model (the float32 transformers reference)"""
    files = sorted((SHIPPED / model.name).glob("*.jsonl"))
    goldens = [g for f in files for g in load_goldens(f) if not g.sampling]
    if not goldens:
        raise KolibriError(f"no goldens ship for {model.name!r} (kolibri ships them for "
                           "smollm2-135m-instruct): --fidelity measures a path against them")
    return goldens


def file_goldens(model, path) -> list[Golden]:
    """The greedy goldens of a file, each of this model and fitting it"""
    goldens = load_goldens(path)
    greedy = [g for g in goldens if not g.sampling]
    if not greedy:
        raise KolibriError(f"{path} holds no greedy golden: --fidelity replays greedy chains "
                           "(record them with `kolibri goldens record --temperature 0`)")
    ours = model.identity
    for g in greedy:
        if g.model != model.name and not (g.model_sha256 or g.identity):
            raise KolibriError(f"golden {g.id!r} of {path} was recorded from {g.model!r}, "
                               f"not {model.name!r}")
        if key := g.made_by.conflict(ours):
            raise KolibriError(f"golden {g.id!r} of {path} was recorded from another model "
                               f"({key} differs from {model.name!r}'s)")
        check_fits(model, g)
    return greedy
