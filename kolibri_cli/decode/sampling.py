"""Choosing a token from one position's logits: greedy, or sampled with noise keyed by position.

The token at absolute position t is a pure function of (logits_t, the ids before t and where the
prompt among them ends, seed, t) — never of how many tokens shared the forward call or how many
draws came before. Plain decoding
and a speculative verify pass therefore choose the same token at every position they both
compute, at any temperature: speculative output equals plain output, bit for bit.

The rule (docs/sampling.md): x = logits_t with transformers' repetition penalty on the ids
before t, then OpenAI's presence and frequency penalties on the ids generated before t (x_j -=
c_j * frequency + (c_j > 0) * presence, c_j: how often j was generated); s = x / T (float32);
drop tokens outside top-k, then top-p, then min-p of softmax(s) (the order and definitions of
transformers' warpers); choose the argmax over kept tokens of float64(s_i) + g_i, where g_i =
-log(-log(u_i)) is Gumbel noise, u_i = (w_i + 1/2) / 2^32 and w_i the Philox word of (seed, t,
i). Gumbel-max makes the choice a sample of softmax(s) over the kept tokens. T = 0 is greedy:
the argmax of x, no noise.
Non-goals: beam search, typical/eta/epsilon sampling, penalties that depend on anything but the
ids before t.
"""

import math
import sys
import time
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np
from numba import njit

from kolibri_cli.decode.philox import block, words
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))
from kolibri_cli.errors import KolibriError

_FLOAT_MAX = sys.float_info.max  # a JSON integer past it is no float (math.isfinite overflows)

# temperature (but 0) and repetition penalty: divided into or multiplied with float32 logits,
# a value past these bounds rounds to 0 or inf in float32 and the scores turn to inf and NaN
_SCALE = (1e-6, 1e6)
_TWO32 = 2.0**32
_G_MAX = -math.log(-math.log((_TWO32 - 0.5) / _TWO32)) + 1e-6  # largest noise a word can give
_TOP_P_FIRST = 64  # candidates tried first for top-p (grown 8x until they hold the mass)


# The sampling options' help, shared by every command that takes them (generate, chat, bench,
# goldens record, probe --measure).
OPTION_HELP = {
    "temperature": "Sample at this temperature; 0 = greedy. [default: the model's "
                   "generation_config.json, else greedy]",
    "top_k": "Sample among the k most likely tokens; 0 = off.",
    "top_p": "Sample among the most likely tokens holding this much probability; 1 = off.",
    "min_p": "Drop tokens less likely than min-p times the most likely one; 0 = off.",
    "repetition_penalty": "transformers' penalty on tokens already in the context; 1 = off.",
    "seed": "Seed of the position-keyed noise (same seed, same text). [default: random, "
            "printed]",
}


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. Defaults: greedy, no filters."""

    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int = 0  # keep the k highest-scoring tokens (ties at the k-th kept); 0 = off
    top_p: float = 1.0  # keep the most likely tokens until their mass reaches top_p; 1 = off
    min_p: float = 0.0  # keep tokens with p >= min_p * p_max; 0 = off
    repetition_penalty: float = 1.0  # transformers' penalty on ids already seen; 1 = off
    seed: int = 0  # the Philox key (0 .. 2^64-1); unused when greedy
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from each id generated; 0 = off
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per time an id was generated; 0 = off

    @property
    def penalizes(self) -> bool:
        """Any penalty on what came before (the scores are not the bare logits)."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0
                or self.frequency_penalty != 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check(self, prefix: str = "sampling ") -> "Sampling":
        """Self, or a KolibriError naming the bad setting and its value (`prefix` "--": as the
        command line's option)."""
        lo, hi = _SCALE
        bad = [
            (not (self.temperature == 0 or lo <= self.temperature <= hi), "temperature",
             self.temperature, f"a finite number, 0 (greedy) or in [{lo:g}, {hi:g}]"),
            (self.top_k < 0, "top-k", self.top_k, "a whole number >= 0 (0 = off)"),
            (not 0 < self.top_p <= 1, "top-p", self.top_p, "in (0, 1] (1 = off)"),
            (not 0 <= self.min_p <= 1, "min-p", self.min_p, "in [0, 1] (0 = off)"),
            (not lo <= self.repetition_penalty <= hi, "repetition-penalty",
             self.repetition_penalty, f"a finite number in [{lo:g}, {hi:g}] (1 = off)"),
            (not 0 <= self.seed < 2**64, "seed", self.seed, "in 0..2^64-1"),
            *((not -2 <= getattr(self, key) <= 2, key.replace("_", "-"), getattr(self, key),
               "in [-2, 2] (0 = off)") for key in OPENAI_PENALTIES),
        ]
        for wrong, name, value, want in bad:
            if wrong:
                raise KolibriError(f"{prefix}{name} must be {want}, got {value}")
        return self

    def to_dict(self) -> dict:
        """What goldens and --json record: {} for plain greedy, so files without sampling
        parameters read as greedy."""
        penalties = {key: getattr(self, key) for key in OPENAI_PENALTIES if getattr(self, key)}
        if self.greedy:
            return {} if not self.penalizes else {
                "temperature": 0.0, "repetition_penalty": self.repetition_penalty} | penalties
        return {k: v for k, v in asdict(self).items() if k not in OPENAI_PENALTIES} | penalties

    @classmethod
    def from_dict(cls, d: dict) -> "Sampling":
        """The inverse of to_dict; a KolibriError on unknown keys or wrong types."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise KolibriError(f"unknown sampling parameter(s) {', '.join(unknown)}")
        kinds = {"top_k": int, "seed": int}
        for key, value in d.items():
            want = kinds.get(key, int | float)
            if isinstance(value, bool) or not isinstance(value, want):
                raise KolibriError(f"sampling parameter {key} must be a number, got {value!r}")
            if want is not int and isinstance(value, int) and abs(value) > _FLOAT_MAX:
                raise KolibriError(f"sampling parameter {key} must be a finite number, got an "
                                   "integer past a float's range")
        return cls(**d).check()

    def describe(self) -> str:
        """One line for the terminal, e.g. "T=0.7 top-p=0.9 seed=3" or "greedy"."""
        parts = ["greedy" if self.greedy else f"T={self.temperature:g}"]
        parts += [f"{name}={value:g}" for name, value, off in (
            ("top-k", self.top_k, 0), ("top-p", self.top_p, 1), ("min-p", self.min_p, 0),
            ("repetition-penalty", self.repetition_penalty, 1),
            ("presence-penalty", self.presence_penalty, 0),
            ("frequency-penalty", self.frequency_penalty, 0)) if value != off]
        return " ".join(parts + ([] if self.greedy else [f"seed={self.seed}"]))


GREEDY = Sampling()
OPENAI_PENALTIES = ("presence_penalty", "frequency_penalty")  # recorded only when set


def new_seed() -> int:
    """A fresh random seed (printed, so the run can be repeated)."""
    return int(np.random.SeedSequence().entropy % 2**63)


def given_options(temperature: float | None = None, top_k: int | None = None,
                  top_p: float | None = None, min_p: float | None = None,
                  repetition_penalty: float | None = None, seed: int | None = None,
                  greedy: bool = False) -> dict:
    """The sampling options given (None = not given), checked before a model loads; `greedy`
    is temperature 0."""
    if greedy and temperature not in (None, 0):
        raise KolibriError("--greedy and --temperature contradict each other: pass one")
    given = {"temperature": 0.0 if greedy else temperature, "top_k": top_k, "top_p": top_p,
             "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed}
    given = {key: value for key, value in given.items() if value is not None}
    Sampling(**given).check(prefix="--")
    return given


def resolve(model, given: dict, note) -> Sampling:
    """The Sampling of the options `given` on top of the model's generation_config.json; when
    sampling without a seed, a new one, which `note` prints so the run can be repeated."""
    from pathlib import Path

    from kolibri_cli.engine.config import generation_defaults

    folder = model.path is not None and Path(model.path).is_dir()
    settings = (generation_defaults(model.path) if folder else {}) | given
    chosen = Sampling(**settings).check()
    if chosen.greedy and "seed" in given:
        note("note: --seed has no effect: decoding is greedy (sampling needs --temperature > 0)")
    if not chosen.greedy and "seed" not in given:
        chosen = Sampling(**(settings | {"seed": new_seed()}))
        note(f"seed {chosen.seed} (pass --seed {chosen.seed} to repeat this run)")
    return chosen


class Logprobs:
    """What the model gave each chosen token: its log-probability and the `top` most likely
    tokens' (log-softmax of the position's raw logits — before penalties, temperature and
    filters, as vLLM reports them by default), by absolute position, filled as tokens are
    picked. A position's logits are bitwise the same in plain and speculative decoding, so
    its row here is too."""

    def __init__(self, top: int = 0):
        self.top = top
        self.at: dict[int, tuple[int, float, list[tuple[int, float]]]] = {}  # pos -> (token,
        # its logprob, [(id, logprob)] of the `top` most likely, most likely first)

    def add(self, logits: np.ndarray, pos: int, token: int) -> None:
        x = logits.astype(np.float64)  # [V]
        m = x.max()
        x -= m + np.log(np.exp(x - m).sum())  # log-softmax
        top = np.argpartition(-x, self.top - 1)[: self.top] if 0 < self.top < len(x) else \
            np.arange(len(x) if self.top else 0)
        top = top[np.lexsort((top, -x[top]))]  # most likely first, then the lower id
        self.at[pos] = (token, float(x[token]), [(int(i), float(x[i])) for i in top])


class Sampler:
    """Chooses tokens for one generation and adds up the seconds it spends doing so; with
    `logprobs`, records what the model gave each chosen token."""

    def __init__(self, sampling: Sampling = GREEDY, logprobs: Logprobs | None = None,
                 prompt_len: int = 0):
        self.sampling = sampling.check()
        self.seconds = 0.0
        self.logprobs = logprobs
        self.prompt_len = prompt_len  # ids before it are the prompt: not "generated"
        if not self.sampling.greedy:
            _warm_up()  # not inside the first timed pick

    def pick(self, logits: np.ndarray, pos: int, before: np.ndarray) -> int:
        """The token at absolute position `pos` from its logits [V]; `before` = the ids at
        positions 0..pos-1 (prompt and output)."""
        t0 = time.perf_counter()
        token = choose(logits, pos, before, self.sampling, self.prompt_len)
        if self.logprobs is not None:
            self.logprobs.add(logits, pos, token)
        self.seconds += time.perf_counter() - t0
        return token


@cache
def _warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache the sampling kernels, once per
    process."""
    choose(np.zeros(8, np.float32), 1, np.zeros(1, np.int64), Sampling(temperature=1.0))


def choose(logits: np.ndarray, pos: int, before, s: Sampling, prompt_len: int = 0) -> int:
    """The token at absolute position `pos`; `before` = the ids at 0..pos-1, of which those
    from `prompt_len` on were generated."""
    if s.greedy and not s.penalizes:
        return int(np.argmax(logits))  # [V] -> first index of the maximum, like torch
    x = openai_penalized(penalized(logits, before, s.repetition_penalty), before[prompt_len:], s)
    if s.greedy:
        return int(np.argmax(x))
    scores, e = filtered(x / np.float32(s.temperature), s)
    return int(_gumbel_argmax(scores, e, np.uint64(s.seed), pos))


def penalized(logits: np.ndarray, before, penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor: every id seen before gets its logit
    divided by the penalty if positive, multiplied if negative."""
    if penalty == 1:
        return logits
    x = logits.copy()  # [V] float32
    seen = np.unique(np.asarray(before, dtype=np.int64))
    v = x[seen]
    x[seen] = np.where(v < 0, v * np.float32(penalty), v / np.float32(penalty))
    return x


def openai_penalized(logits: np.ndarray, generated, s: Sampling) -> np.ndarray:
    """OpenAI's presence and frequency penalties: x_j - c_j * frequency - (c_j > 0) * presence,
    c_j the times id j was generated (float32)."""
    if s.presence_penalty == 0 and s.frequency_penalty == 0 or len(generated) == 0:
        return logits
    ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
    x = logits.copy()  # [V] float32
    x[ids] -= (np.float32(s.frequency_penalty) * counts.astype(np.float32)
               + np.float32(s.presence_penalty))
    return x


def filtered(scores: np.ndarray, s: Sampling) -> tuple[np.ndarray, np.ndarray]:
    """Scores [V] float32 with -inf outside top-k, then top-p, then min-p (in place), and
    e = exp(scores - max) [V] float32 (0 where dropped), the unnormalised probabilities."""
    n = scores.shape[0]
    if 0 < s.top_k < n:
        kth = np.partition(scores, n - s.top_k)[n - s.top_k]
        scores[scores < kth] = -np.inf
    e = np.exp(scores - scores.max())
    if s.top_p < 1:
        _drop(scores, e, _outside_top_p(e, s.top_p))
    if s.min_p > 0:
        _drop(scores, e, e < np.float32(s.min_p))
    return scores, e


def _drop(scores: np.ndarray, e: np.ndarray, where) -> None:
    scores[where] = -np.inf
    e[where] = 0


def _outside_top_p(e: np.ndarray, top_p: float) -> np.ndarray:
    """Mask [V] of tokens outside the nucleus: in descending probability, a token is kept while
    the mass above it is < top_p (transformers: ascending cumulative mass <= 1 - top_p drops).
    Sorts only the top candidates, growing them until they hold top_p of the mass."""
    n, total = e.shape[0], float(e.sum(dtype=np.float64))
    m = min(_TOP_P_FIRST, n)
    while True:
        top = np.argpartition(e, n - m)[n - m :] if m < n else np.arange(n)
        top = top[np.lexsort((top, -e[top]))]  # descending probability, then ascending id
        mass = np.cumsum(e[top], dtype=np.float64) / total
        if mass[-1] >= top_p or m == n:
            break
        m = min(n, 8 * m)
    above = np.concatenate(([0.0], mass[:-1]))
    outside = np.ones(n, dtype=bool)
    outside[top[above < top_p]] = False
    return outside


@njit(cache=True)
def _gumbel_argmax(scores, e, seed, pos):
    """argmax over tokens with a finite score of float64(scores[i]) + g(seed, pos, i), lowest id
    on ties — computing the noise only of tokens that can still beat the best so far: a token
    whose score is more than the largest possible noise below it, or whose uniform draw is too
    small (1 - u >= 2 exp(score - best) rules out g > best - score), cannot."""
    top = np.argmax(scores)
    w = block(top // 4, pos, seed)[top % 4]
    best, b = top, np.float64(scores[top]) + _gumbel(w)
    c = 2.0 * np.exp(np.float64(scores[top]) - b)  # e[i] * c = 2 exp(scores[i] - b)
    ws, cur = np.empty(4, np.uint64), -1  # the words of block `cur`
    for i in range(scores.shape[0]):
        if scores[i] + _G_MAX < b:
            continue
        if i // 4 != cur:
            cur = i // 4
            ws[0], ws[1], ws[2], ws[3] = block(cur, pos, seed)
        w = ws[i % 4]
        if (_TWO32 - 0.5 - w) / _TWO32 >= c * e[i]:
            continue
        v = np.float64(scores[i]) + _gumbel(w)
        if v > b or (v == b and i < best):
            best, b = i, v
            c = 2.0 * np.exp(np.float64(scores[top]) - b)
    return best


@njit(cache=True)
def _gumbel(w):
    return -np.log(-np.log((np.float64(w) + 0.5) / _TWO32))


def gumbel_noise(seed: int, pos: int, n: int) -> np.ndarray:
    """[n] float64: g(seed, pos, i) for every token i (tests and the reference engine)."""
    u = (words(np.uint64(seed), pos, n).astype(np.float64) + 0.5) / _TWO32
    return -np.log(-np.log(u))


def perturbed(logits: np.ndarray, pos: int, before, s: Sampling,
              prompt_len: int = 0) -> np.ndarray:
    """[V] float64: what the sampled choice is the argmax of — float64(scores) + noise, -inf
    where filtered out — computed for every token, without shortcuts (the reference
    engine's margins, and the tests' check of the fast path)."""
    x = openai_penalized(penalized(logits, before, s.repetition_penalty), before[prompt_len:], s)
    scores, _ = filtered(x / np.float32(s.temperature), s)
    return scores.astype(np.float64) + gumbel_noise(s.seed, pos, scores.shape[0])
