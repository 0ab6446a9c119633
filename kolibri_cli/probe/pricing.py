"""Which c(n) the probe prices forward passes with, and where they came from: given (`--costs`),
timed on this host by `kolibri bench` for the goldens' model (store/benchcosts.py), or a guess.

Scope: choosing the costs and saying why. The guess is only the fallback when nothing measured
applies; the output says so and names the command that measures.
"""

from dataclasses import dataclass, replace

from kolibri_cli.decode.costs import DEFAULT_COST_SLOPE, GUESSED_COSTS, cost_model
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens
from kolibri_cli.store import benchcosts
from kolibri_cli.store.benchcosts import BenchCosts

PROBE_NUMERICS = "float32"  # the numeric path the probe's --measure loads models with


@dataclass(frozen=True)
class Pricing:
    """The c(n) a probe used and their source: "given", "bench" or "guess"."""

    source: str
    costs: dict[int, float]
    bench: BenchCosts | None = None  # source "bench": the measurement used
    reason: str = ""  # source "guess": why nothing measured was used
    note: str = ""  # for stderr: a guess where a bench could measure, a bench by another version

    def source_text(self) -> str:
        """"c(n) from kolibri bench of 2026-11-30 22:41 UTC (threads 2)", "c(n) from --costs"
        or "c(n) guessed (why)"."""
        if self.source == "bench":
            return f"c(n) from kolibri bench of {self.bench.date} (threads {self.bench.threads})"
        if self.source == "given":
            return "c(n) from --costs"
        return f"c(n) guessed ({self.reason})"

    def line(self) -> str:
        """The source and the values, for the text output and the reports."""
        c, top = cost_model(self.costs), 6 if self.source == "guess" else max(self.costs)
        values = ", ".join(f"c({n})={c(n):.2f}" for n in range(2, top + 1))
        return f"{self.source_text()}: {values}"

    def to_json(self) -> dict:
        return {"source": self.source, "costs": {str(n): c for n, c in sorted(self.costs.items())},
                "bench": None if self.bench is None else
                {k: v for k, v in self.bench.to_json().items() if k != "costs"},
                "reason": self.reason or None}


def live_runs(runs: list, pricing: Pricing) -> list:
    """The runs as --measure runs them live: a guard not given --costs times its own costs as it
    runs, as `kolibri generate --spec` does (its simulation then replays what it read)."""
    if pricing.source == "given":
        return runs
    return [replace(r, costs=None) if r.proposer == "guard" else r for r in runs]


def source_text(pricing: Pricing | None) -> str:
    """Where a report's c(n) came from; without a Pricing (a library caller's runs), what
    SimRun.modelled_speedup falls back to."""
    if pricing is None:
        return f"c(n) as given to the runs, else 1 + {DEFAULT_COST_SLOPE:g} (n - 1)"
    return pricing.source_text()


def choose(given: dict[int, float] | None, goldens: list, threads: int | None,
           use_bench: bool = True, engine: str | None = None) -> Pricing:
    """Given costs; else the latest bench of the goldens' model (with `threads` if given); else
    the guess, with a note saying how to measure (`use_bench` False: the guess, asked for,
    without a note)."""
    if given:
        return Pricing("given", dict(given))
    if not use_bench:
        return Pricing("guess", GUESSED_COSTS, reason="--costs default")
    if engine not in (None, "kolibri"):
        return Pricing("guess", GUESSED_COSTS, reason=f"kolibri's bench does not time {engine}")
    models = goldens_models(goldens)
    if len(models) != 1:
        return _guess("the goldens come from several models" if models else "no goldens read",
                      "")
    name, sha256 = models.pop()
    try:
        entries = benchcosts.load()
    except KolibriError as e:
        return _guess("the stored bench costs are unreadable", f": ignoring them: {e}")
    found = benchcosts.find(entries, sha256, PROBE_NUMERICS, threads)
    if found is None:
        with_threads = "" if threads is None else f" --threads {threads}"
        return _guess(f"no kolibri bench of {name}{with_threads} stored",
                      f": `kolibri bench -m {name}{with_threads}` measures this host")
    return Pricing("bench", found.costs, bench=found, note=_stale(found, name))


def _stale(found: BenchCosts, name: str) -> str:
    """A note when the bench ran another kolibri version (its kernel may have changed since)."""
    from kolibri_cli import __version__

    if found.kolibri == __version__:
        return ""
    return (f"note: c(n) from a bench by kolibri {found.kolibri} ({found.date}); this is kolibri "
            f"{__version__}: `kolibri bench -m {name}` measures its kernel")


def _guess(reason: str, hint: str) -> Pricing:
    return Pricing("guess", GUESSED_COSTS, reason=reason, note="note: c(n) is a guess (the "
                   f"default model's on a 2-core AVX-512 host): {reason}{hint}")


def goldens_models(paths: list) -> set[tuple[str, str]]:
    """{(name, sha256)} of the models the goldens were recorded from, by the first golden of
    each file (a file holds one model's chains)."""
    models = set()
    for file in find_golden_files(paths):
        first = next(iter_goldens([file]), None)
        if first is not None:
            models.add((first.model, first.model_sha256))
    return models
