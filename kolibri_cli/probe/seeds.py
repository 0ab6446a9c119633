"""Figures over sampling seeds: a sampled golden set holds one chain per prompt and seed, so each
seed gives its own acceptance, pass ratio and modelled speedup; the probe reports their mean and
spread, per category and overall. The counts themselves stay exact (a sampled chain is a chain).
Non-goals: rendering (report.py, cli/render/probe.py).
"""

import statistics
from dataclasses import dataclass

from kolibri_cli.probe.simulate import Counts, SimRun, merge_counts

FIGURES = ("acceptance_rate", "ratio", "modelled_speedup")


@dataclass
class Spread:
    mean: float | None
    sd: float | None  # sample standard deviation over seeds
    n: int  # seeds with a value

    def to_json(self) -> dict:
        return {"mean": self.mean, "sd": self.sd, "seeds": self.n}


def seed_spread(run: SimRun) -> dict[str, dict[str, Spread]] | None:
    """{category (and "all"): {figure: Spread over seeds}}; None with fewer than two seeds (or
    too many to keep apart: see shards.MAX_SEEDS)."""
    by_seed = run.by_seed or {}
    if len(by_seed) < 2:
        return None
    per_seed = [_figures(run, by_seed[seed]) for seed in sorted(by_seed)]
    categories = list(dict.fromkeys(c for figures in per_seed for c in figures))
    return {c: {f: _spread([p[c][f] for p in per_seed if c in p]) for f in FIGURES}
            for c in categories}


def _figures(run: SimRun, categories: dict[str, Counts]) -> dict[str, dict[str, float | None]]:
    """One seed's figures, overall ("all") and per category, from its counts per category."""
    groups = {"all": merge_counts(list(categories.values()), run.k)} | categories
    return {category: {"acceptance_rate": c.acceptance_rate, "ratio": c.ratio,
                       "modelled_speedup": run.modelled_speedup(c)}
            for category, c in groups.items()}


def _spread(values: list[float | None]) -> Spread:
    values = [v for v in values if v is not None]
    if not values:
        return Spread(None, None, 0)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(statistics.fmean(values), sd, len(values))
