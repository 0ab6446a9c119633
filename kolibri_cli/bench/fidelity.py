"""How faithful a numeric path is, measured on greedy goldens of its model (the shipped ones, or a
file recorded with `kolibri goldens record --engine transformers`, e.g. on Spec-Bench prompts):
how many of their chains (the float32 transformers reference) it reproduces token for token, and
the largest absolute difference of any logit at any of their positions from the float32 path (the
model's stored values decoded exactly, which transformers on the dequantized weights matches),
and for each chain it does not reproduce, where and how: the first divergent step and the
reference's top-2 logit margin there. Each logit of a path that differs from the float32 path's
by up to d can move the margin between two tokens by up to 2d, so a divergence at a margin below
max(NEAR_TIE, 2 x the largest difference measured) is "at a near-tie": rounding alone can flip
it (NEAR_TIE, the floor `goldens check` uses, covers the float32 path against transformers). A
divergence at a margin at or above that is a fidelity failure; one without a recorded margin is
counted apart.

Non-goals: sampled goldens (a path's greedy chains are what it changes), other models' goldens.
"""

from dataclasses import asdict, dataclass, field

import numpy as np

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import SHIPPED, Golden, load_goldens
from kolibri_cli.goldens.record import NEAR_TIE, check_fits, check_one

LOGIT_LAW = 1e-2  # the largest |logit - float32 path's| a default path may have (docs/bench.md)


@dataclass
class Divergence:
    golden: str  # its id
    step: int  # the first output index where the path's chain differs
    ours: int | None  # the path's token there
    reference: int | None  # the golden's token there
    margin: float | None  # the reference's top-2 logit margin there (None: not recorded)
    near_tie: bool = False  # at a margin below the run's tie (Fidelity.tie)


@dataclass
class Fidelity:
    numerics: str  # the numeric path measured
    source: str  # "shipped", or the goldens file measured against
    references: list[str]  # the engines that recorded those goldens (e.g. ["transformers"])
    goldens: int  # greedy goldens of this model
    reproduced: int  # of them, chains equal token for token
    max_logit_diff: float  # largest |logit - float32 path's| over every golden position
    at: str  # the golden holding it
    divergences: list[Divergence] = field(default_factory=list)  # the chains not reproduced
    tie: float = NEAR_TIE  # a divergence at a reference margin below it is at a near-tie
    bound: float = LOGIT_LAW  # the largest |logit diff| the default path's law allows

    @property
    def at_near_tie(self) -> int:
        return sum(d.near_tie for d in self.divergences)

    @property
    def unrecorded(self) -> int:
        """Divergences whose golden recorded no margin there: not classified"""
        return sum(d.margin is None for d in self.divergences)

    @property
    def failures(self) -> int:
        """Divergences at a recorded margin >= the tie: not explained by rounding"""
        return len(self.divergences) - self.at_near_tie - self.unrecorded

    @property
    def within_law(self) -> bool:
        return self.max_logit_diff <= self.bound

    def to_dict(self) -> dict:
        return asdict(self) | {"at_near_tie": self.at_near_tie, "failures": self.failures,
                               "unrecorded": self.unrecorded, "within_law": self.within_law}


def tie_margin(max_logit_diff: float) -> float:
    """The reference margin below which a path whose logits differ by up to max_logit_diff can
    flip a step by rounding alone (never below NEAR_TIE)"""
    return max(NEAR_TIE, 2.0 * max_logit_diff)


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
    divergences, tie = [], tie_margin(worst)
    for i, g in enumerate(greedy):
        c = check_one(model, g)
        if not c.identical:
            m = c.reference_margin
            divergences.append(Divergence(str(g.id), c.index, c.ours, c.reference, m,
                                          m is not None and m < tie))
        if progress:
            progress(i + 1)
    engines = sorted({g.reference.get("engine", "kolibri") for g in greedy})
    return Fidelity(model.numerics, source, engines, len(greedy), len(greedy) - len(divergences),
                    worst, at, divergences, tie)


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
