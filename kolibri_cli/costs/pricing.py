"""Which c(n) a model's forward passes are priced with, and where they came from: given
(`--costs`), timed on this host by `kolibri bench` for the model (costs/store.py), timed by
the running bench itself, or a guess. One choice for `kolibri generate` / `chat` (the adaptive
proposers draft by it) and `kolibri probe` (`for_goldens`, given the goldens' model), so
a probe's simulation of adaptive describes what generate does.

Scope: choosing the costs and saying why. The guess is only the fallback when nothing measured
applies; the output says so and names the command that measures. Non-goal: the guard's costs
while generating (it times its own, costs/model.py CostTable).
"""

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kolibri_cli.costs import store as benchcosts
from kolibri_cli.costs.model import DEFAULT_COST_SLOPE, GUESS_HOST, GUESSED_COSTS, cost_model
from kolibri_cli.costs.store import BenchCosts
from kolibri_cli.errors import KolibriError

MEASURE_HINT = "`--costs measure` times this host once (tens of seconds) and keeps it"
# How far c(n) - 1 may be off where no rounds were timed (a lognormal factor of this sigma on
# c(n) - 1, drawn per bootstrap resample): a curve given by the user, the guess (one host's
# shape: on two other CPUs the default path's c(6) - 1 ranged over a factor of 2.4), and a
# stored bench from before rounds were kept.
STATED_ERROR = {"given": 0.05, "guess": 0.30, "bench": 0.10, "run": 0.10}


@dataclass(frozen=True)
class Pricing:
    """The c(n) a run used and their source: "given", "bench", "run" (timed by the same
    `kolibri bench` run) or "guess"."""

    source: str
    costs: dict[int, float]
    bench: BenchCosts | None = None  # source "bench": the measurement used
    reason: str = ""  # source "guess": why nothing measured was used
    note: str = ""  # for stderr: a guess where a bench could measure, a bench by another version
    hint: str = ""  # source "guess": the command that would measure instead
    rounds: tuple = field(default=(), compare=False)  # each timed round's c(n) ({n: c}), the
    # spread of `costs` (their median); () where none were kept: STATED_ERROR says the spread

    @property
    def error(self) -> float | None:
        """The stated relative error of c(n) - 1 (None when rounds give the spread)."""
        return None if len(self.rounds) > 1 else STATED_ERROR.get(self.source, 0.0)

    def curves(self, top: int, draws: int, seed: int = 0) -> np.ndarray:  # -> [draws, top + 1]
        """c(0..top) as drawn from its own uncertainty (c[:, 0] = 0): the median of the rounds
        resampled with replacement, or c(n) - 1 scaled by a lognormal factor of sigma `error`."""
        rng = np.random.default_rng(seed)
        if self.error is None:
            per_round = np.array([_curve(r, top) for r in self.rounds])  # [R, top + 1]
            picks = rng.integers(0, len(per_round), (draws, len(per_round)))  # [draws, R]
            return np.median(per_round[picks], axis=1)
        base = _curve(self.costs, top)  # [top + 1]
        factor = np.exp(rng.normal(0.0, self.error, (draws, 1)))  # [draws, 1]
        curves = 1.0 + (base - 1.0) * factor
        curves[:, 0] = 0.0
        return curves

    def spread_text(self) -> str:
        """Where the c(n) spread of the intervals comes from, in a few words."""
        if self.error is None:
            return f"the median of {len(self.rounds)} timed rounds, and their spread"
        return f"a stated {100 * self.error:.0f}% error on c(n) - 1"

    def source_text(self) -> str:
        """"c(n) from kolibri bench of 2026-11-30 22:41 UTC (threads 2)", "c(n) from --costs"
        or "c(n) guessed (why)"."""
        if self.source == "bench":
            b = self.bench
            return (f"c(n) from kolibri bench of {b.model} ({b.numerics}, {b.threads} threads, "
                    f"kolibri {b.kolibri}{' ' + b.commit if b.commit else ''}) on {b.cpu}, "
                    f"{b.date}")
        if self.source == "given":
            return "c(n) from --costs"
        if self.source == "run" and self.bench is not None:
            b = self.bench
            return (f"c(n) timed in this run on {b.model} ({b.numerics}, {b.threads} threads) on "
                    f"{b.cpu}, kept for later runs")
        if self.source == "run":
            return "c(n) measured in this run"
        return f"c(n) guessed ({self.reason})"

    def line(self) -> str:
        """The source and the values, for the text output and the reports."""
        return f"{self.source_text()}: {self.values()}"

    def values(self) -> str:
        """"c(2)=1.32, c(3)=1.47, ...": up to the largest n given (a curve: its first 8 and its
        last)."""
        c, top = cost_model(self.costs), 6 if self.source == "guess" else max(self.costs)
        shown = [n for n in range(2, min(top, 9) + 1)] + ([top] if top > 9 else [])
        return ", ".join(f"c({n})={c(n):.2f}" for n in shown)

    def priced_line(self) -> str:
        """One line: the c(n) every prediction used and what their spread rests on."""
        stale = "; STALE: timed on another kernel" if self.stale else ""
        return f"priced with {self.values()} ({self.spread_text()}{stale})"

    @property
    def stale(self) -> bool:
        """A stored bench timed by another kernel (or kolibri) than the one running now."""
        from kolibri_cli import __version__

        return self.source == "bench" and self.bench is not None and (
            self.bench.kolibri, self.bench.kernel) != (__version__, benchcosts.kernel_id())

    def to_json(self) -> dict:
        return {"source": self.source, "costs": {str(n): c for n, c in sorted(self.costs.items())},
                "bench": None if self.bench is None else
                {k: v for k, v in self.bench.to_json().items() if k not in ("costs", "runs")},
                "reason": self.reason or None, "rounds": len(self.rounds),
                "error": self.error, "stale": self.stale}


def _curve(costs: dict[int, float] | None, top: int) -> np.ndarray:  # -> [top + 1]
    c = cost_model(costs)
    return np.array([0.0, *(c(n) for n in range(1, top + 1))])


def parse_costs(items: list, shown: str, what: str = "costs") -> dict[int, float]:
    """["1", "1.05", "1.1"] (or numbers) -> {1: 1.0, 2: 1.05, 3: 1.1}: c(n) for n = 1, 2, ...;
    anything else is a KolibriError naming `what` and showing the value as `shown`."""
    try:
        costs = [float(item) for item in items]
    except (TypeError, ValueError, OverflowError):
        costs = []
    if not costs or any(not math.isfinite(c) or c <= 0 for c in costs):
        raise KolibriError(f"{what} must be finite positive numbers c(1),c(2),... (e.g. "
                           f"1,1.05,1.1) or default, got {shown}")
    return {n: c for n, c in enumerate(costs, start=1)}


MAX_FILE_BYTES = 1 << 20  # a c(n) file larger than this is not one
MAX_ROWS_GIVEN = 65536  # the largest n a given c(n) may name


def read_costs_file(path: Path) -> dict[int, float]:
    """A c(n) curve from a file: a JSON object {"1": 1.0, "8": 1.9, ...} (n -> c(n); any unit,
    divided by c(1)) or text lines "n c" / "n,c" (# comments). n need not be consecutive: c is
    linear between the n given and follows the last slope beyond them. Anything else is one
    KolibriError naming the file."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise KolibriError(f"--costs {path}: larger than {MAX_FILE_BYTES >> 20} MB; a c(n) "
                               "curve is a few hundred numbers")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise KolibriError(f"--costs {path}: cannot read it ({why})") from None
    pairs = _json_pairs(text) if text.lstrip().startswith("{") else _text_pairs(text)
    return _checked_curve(pairs, path)


def _json_pairs(text: str) -> list:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return []
    return list(obj.items()) if isinstance(obj, dict) else []


def _text_pairs(text: str) -> list:
    lines = [line.split("#")[0].replace(",", " ").split() for line in text.splitlines()]
    return [tuple(parts) if len(parts) == 2 else (None, None) for parts in lines if parts]


def _checked_curve(pairs: list, path) -> dict[int, float]:
    try:
        curve = {int(n): float(c) for n, c in pairs}
    except (TypeError, ValueError, OverflowError):
        curve = {}
    ok = (curve and 1 in curve and len(curve) == len(pairs)
          and all(1 <= n <= MAX_ROWS_GIVEN for n in curve)
          and all(math.isfinite(c) and c > 0 for c in curve.values()))
    if not ok:
        raise KolibriError(f"--costs {path}: not a c(n) curve; write a JSON object "
                           '{"1": 1.0, "8": 1.9, ...} or lines "n c", with n = 1 among them, '
                           f"each n in 1..{MAX_ROWS_GIVEN} once, each c finite and positive")
    return dict(sorted(curve.items()))


def asked(given: dict[int, float] | None, use_bench: bool = True) -> Pricing | None:
    """The costs the user chose: numbers (`--costs 1,1.3,...`) or the guess (`--costs default`,
    `use_bench` False, without a note); None when nothing was asked and kolibri chooses."""
    if given:
        return Pricing("given", dict(given))
    if not use_bench:
        return Pricing("guess", GUESSED_COSTS, reason="--costs default")
    return None


def for_model(name: str, sha256: str, numerics: str, threads: int | None) -> Pricing:
    """The latest bench of this model and numerics (with `threads` threads if given); else the
    guess, with a note saying how to measure."""
    try:
        entries = benchcosts.load()
    except KolibriError as e:
        return guess("the stored bench costs are unreadable", f": ignoring them: {e}")
    found = benchcosts.find(entries, sha256, numerics, threads)
    if found is None:
        run = _bench_args(name, numerics, threads)
        return guess(f"no kolibri bench of {run} stored",
                     f": `kolibri bench -m {run}` measures this host")
    return Pricing("bench", found.costs, bench=found, note=_stale(found, name),
                   rounds=found.rounds)


def _bench_args(name: str, numerics: str, threads: int | None = None) -> str:
    """`name` and the options of the `kolibri bench` that times it on `numerics`: --quantize
    only where that is not the model's default path."""
    from kolibri_cli.store.models import default_numerics_of

    quantize = "" if numerics == default_numerics_of(name) else f" --quantize {numerics}"
    return f"{name}{quantize}{'' if threads is None else f' --threads {threads}'}"


def _stale(found: BenchCosts, name: str) -> str:
    """A note when the bench timed another kernel than this one (or another kolibri version)."""
    from kolibri_cli import __version__

    if found.kolibri == __version__ and found.kernel == benchcosts.kernel_id():
        return ""
    return (f"note: c(n) from a bench of another kernel (kolibri {found.kolibri}, {found.date}): "
            f"`kolibri bench -m {_bench_args(name, found.numerics)}` measures this one")


def guess(reason: str, hint: str, measure: str = "") -> Pricing:
    """The guess, with a note giving the reason (and `hint`, what would measure; `measure`, the
    option of the command at hand that would)."""
    return Pricing("guess", GUESSED_COSTS, reason=reason, note="note: c(n) is a guess (the "
                   f"default model's on {GUESS_HOST}): {reason}{hint}", hint=measure)


def source_text(pricing: Pricing | None) -> str:
    """Where a report's c(n) came from; without a Pricing (a library caller's runs), what
    SimRun.modelled_speedup falls back to."""
    if pricing is None:
        return f"c(n) as given to the runs, else 1 + {DEFAULT_COST_SLOPE:g} (n - 1)"
    return pricing.source_text()


def for_goldens(given: dict[int, float] | None, models: set[tuple[str, str]],
                threads: int | None, use_bench: bool = True, engine: str | None = None) -> Pricing:
    """The probe's choice: given costs; else the latest bench of the goldens' model (`models`:
    {(name, sha256)} they were recorded from; with `threads` if given); else the guess, with a
    note saying how to measure (`use_bench` False: the guess, asked for, without a note)."""
    if (chosen := asked(given, use_bench)) is not None:
        return chosen
    if engine not in (None, "kolibri"):
        return Pricing("guess", GUESSED_COSTS, reason=f"kolibri's bench does not time {engine}")
    if len(models) != 1:
        return guess("the goldens come from several models" if models else "no goldens read", "")
    name, sha256 = next(iter(models))
    from kolibri_cli.store.models import default_numerics_of

    chosen = for_model(name, sha256, default_numerics_of(name), threads)  # what --measure runs
    return replace(chosen, hint=MEASURE_HINT) if chosen.source == "guess" else chosen
