"""Which c(n) the probe prices forward passes with, and where they came from: given (`--costs`),
timed on this host by `kolibri bench` for the goldens' model (store/benchcosts.py), or a guess.

Scope: choosing the costs and saying why. The guess is only the fallback when nothing measured
applies; the output says so and names the command that measures.
"""

from dataclasses import replace

from kolibri_cli.decode.costs import DEFAULT_COST_SLOPE, GUESSED_COSTS
from kolibri_cli.decode.pricing import Pricing, asked, for_model, guess
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.stream import find_golden_files, iter_goldens

MEASURE_REPEATS = 5  # --costs measure: medians of this many interleaved timings per row count
MEASURE_HINT = "`--costs measure` times this host once (tens of seconds) and keeps it"
PROBE_NUMERICS = "float32"  # the numeric path the probe's --measure loads models with
__all__ = ["Pricing", "choose", "goldens_models", "live_runs", "measure_here", "source_text"]


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


def measured_model(goldens: list) -> str:
    """The name of the one model `--costs measure` times: the goldens' (one model only)."""
    models = goldens_models(goldens)
    if len(models) != 1:
        raise KolibriError("--costs measure times the goldens' model, but these goldens come "
                           f"from {len(models)} models; probe one model's goldens at a time, or "
                           "give --model")
    return next(iter(models))[0]


def measure_here(model, config, ticks=None) -> Pricing:
    """c(1..n) timed now on `model` with this host's kernel, for every row count the run's
    configurations verify (k + 1), kept in the bench store as `kolibri bench` keeps its own;
    priced as timed (source "run")."""
    from kolibri_cli.bench.timing import costs, forward_times
    from kolibri_cli.decode.costs import BENCH_CONTEXT
    from kolibri_cli.engine.jit import get_threads
    from kolibri_cli.store import benchcosts

    models = goldens_models(config.goldens)
    if models and model.sha256 not in {sha for _, sha in models}:
        raise KolibriError(f"--costs measure: {model.name} is not the model these goldens were "
                           "recorded from (its weights differ); give --model the goldens' model")
    top = max(k for k, _ in settings_of(config)) + 1
    timed = costs(forward_times(model.transformer, top, BENCH_CONTEXT, MEASURE_REPEATS, ticks))
    entry = benchcosts.save(benchcosts.entry_for(model, get_threads(), timed))
    return Pricing("run", timed, bench=entry)


def settings_of(config) -> list[tuple[int, tuple[int, int]]]:
    """(k, window) of every configuration the run simulates."""
    from kolibri_cli.decode.proposers import default_settings

    return [(k, w) for p in config.proposer for k in (config.k or [default_settings(p)[0]])
            for w in (config.window or [default_settings(p)[1]])]


def goldens_models(paths: list) -> set[tuple[str, str]]:
    """{(name, sha256)} of the models the goldens were recorded from, by the first golden of
    each file (a file holds one model's chains)."""
    models = set()
    for file in find_golden_files(paths):
        first = next(iter_goldens([file]), None)
        if first is not None:
            models.add((first.model, first.model_sha256))
    return models
