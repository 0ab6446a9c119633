"""How faithful a numeric path is, measured on the shipped goldens of its model: how many of their
greedy chains (the float32 transformers reference) it reproduces token for token, and the largest
absolute difference of any logit at any of their positions from the float32 path (the model's
stored values decoded exactly, which transformers on the dequantized weights matches).

Non-goals: sampled goldens (a path's greedy chains are what it changes), other models' goldens.
"""

from dataclasses import asdict, dataclass

import numpy as np

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import SHIPPED, Golden, load_goldens
from kolibri_cli.goldens.record import check_one


@dataclass
class Fidelity:
    numerics: str  # the numeric path measured
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


def measure_fidelity(model, reference, goldens: list[Golden]) -> Fidelity:
    """`model` on its numeric path against the greedy `goldens` and against `reference`, the
    same model on the float32 path (the model itself when it is on that path)."""
    greedy = [g for g in goldens if not g.sampling]
    worst, at = 0.0, ""
    for g in greedy:
        if reference is not model:
            diff = float(np.abs(teacher_forced(model, g) - teacher_forced(reference, g)).max())
            worst, at = max((worst, at), (diff, str(g.id)))
    reproduced = sum(check_one(model, g).identical for g in greedy)
    return Fidelity(model.numerics, len(greedy), reproduced, worst, at)


def shipped_goldens(model) -> list[Golden]:
    """The greedy goldens shipped for this model (the float32 transformers reference)"""
    files = sorted((SHIPPED / model.name).glob("*.jsonl"))
    goldens = [g for f in files for g in load_goldens(f) if not g.sampling]
    if not goldens:
        raise KolibriError(f"no goldens ship for {model.name!r} (kolibri ships them for "
                           "smollm2-135m-instruct): --fidelity measures a path against them")
    return goldens
