"""Which c(n) the probe prices forward passes with, and where they came from: given (`--costs`),
timed on this host by `kolibri bench` for the goldens' model (store/benchcosts.py), or a guess.

Scope: choosing the costs and saying why. The guess is only the fallback when nothing measured
applies; the output says so and names the command that measures.
"""

from dataclasses import replace

from kolibri_cli.decode.costs import DEFAULT_COST_SLOPE, GUESSED_COSTS
from kolibri_cli.decode.pricing import Pricing, asked, for_model, guess
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens

MEASURE_HINT = "`--costs measure` times this host once (tens of seconds) and keeps it"
PROBE_NUMERICS = "float32"  # the numeric path the probe's --measure loads models with
__all__ = ["Pricing", "choose", "goldens_models", "live_runs", "source_text"]


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
    without a note). The choice itself is decode/pricing.py's, shared with `kolibri generate`."""
    if (chosen := asked(given, use_bench)) is not None:
        return chosen
    if engine not in (None, "kolibri"):
        return Pricing("guess", GUESSED_COSTS, reason=f"kolibri's bench does not time {engine}")
    models = goldens_models(goldens)
    if len(models) != 1:
        return guess("the goldens come from several models" if models else "no goldens read", "")
    name, sha256 = models.pop()
    chosen = for_model(name, sha256, PROBE_NUMERICS, threads)
    return replace(chosen, hint=MEASURE_HINT) if chosen.source == "guess" else chosen


def goldens_models(paths: list) -> set[tuple[str, str]]:
    """{(name, sha256)} of the models the goldens were recorded from, by the first golden of
    each file (a file holds one model's chains)."""
    models = set()
    for file in find_golden_files(paths):
        first = next(iter_goldens([file]), None)
        if first is not None:
            models.add((first.model, first.model_sha256))
    return models
