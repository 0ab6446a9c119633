"""The probe's outputs: the JSON document (stable schema), the Markdown report, and CI gates.

Scope: turning simulation results (and the measured `Measured`) into JSON/Markdown
and gate verdicts. Non-goals: terminal rendering (render_probe.py), computing the figures.
Schema: docs/probe.md. Bump SCHEMA_VERSION on any incompatible change.
"""

from dataclasses import dataclass, field
from pathlib import Path

from kolibri_cli.decode.proposers import format_window
from kolibri_cli.probe.config import ProbeConfig
from kolibri_cli.probe.pricing import source_text as pricing_source
from kolibri_cli.probe.seeds import FIGURES, seed_spread
from kolibri_cli.probe.simulate import Counts, SimRun, best_per_proposer, best_run
from kolibri_cli.text import clean

SCHEMA_VERSION = 1
RunKey = tuple[str, int, tuple[int, int]]  # (proposer, k, window)


def run_key(run: SimRun) -> RunKey:
    return run.proposer, run.k, run.window


MIN_TIMED_STEPS = 4  # decode steps: 1-3 last a few ms, where scheduling noise alone gave
# "speedups" of 1.29x-1.43x on 1-2 token chains


def too_short_to_time(decode_steps: int) -> bool:
    """A golden of so few decode steps that its measured speedup is timing noise."""
    return decode_steps < MIN_TIMED_STEPS


def timed_only(items: list, goldens: list["MeasuredGolden"]) -> list:
    """Of `items` (one per golden), those of the goldens long enough to time, or all of them
    when none is: what the overall figures are taken over."""
    return [x for x, g in zip(items, goldens, strict=True) if not g.too_short] or items


@dataclass
class MeasuredGolden:
    """One golden run with the model, plain and speculative (filled by the measuring probe)."""

    id: str | int
    plain_tokens_per_s: float  # decode tok/s, prefill excluded
    spec_tokens_per_s: float
    speedup: float  # spec_tokens_per_s / plain_tokens_per_s
    predicted_speedup: float | None  # cost model over this golden's simulated draft lengths
    spec_equals_plain: bool  # spec output ids == plain output ids
    first_divergence: int | None  # first index where the model's plain ids differ from the golden
    counts_match_simulation: bool  # verify passes, drafts proposed/accepted == simulated
    verify_passes: int  # of the real spec run
    drafts_proposed: int
    drafts_accepted: int
    simulated_proposed: int | None = None  # a server's run: kolibri's simulated counts, which
    simulated_accepted: int | None = None  # must equal the server's own counters above
    too_short: bool = False  # under MIN_TIMED_STEPS decode steps: its speedup is timing noise,
    # left out of the overall figures and the worst (kolibri's measurement and a server's)
    # (low, high): a distribution-free 95% interval for `speedup`, the median of the rounds'
    # paired ratios (`median_interval`); None with too few rounds or another statistic
    speedup_interval: tuple[float, float] | None = None


@dataclass
class Measured:
    """A configuration run with the model over every golden (filled by the measuring probe)."""

    plain_tokens_per_s: float  # over all goldens: new tokens / decode seconds
    spec_tokens_per_s: float
    speedup: float  # spec / plain
    predicted_speedup: float | None  # cost model over all goldens
    costs: dict[int, float]  # c(n) = time(n-token forward) / time(1-token forward), n = 1..k+1
    proposer_s_per_pass: float  # measured proposer time per verify pass
    spec_equals_plain: bool  # on every golden
    counts_match_simulation: bool  # on every golden
    goldens: list[MeasuredGolden] = field(default_factory=list)
    engine: str = "kolibri"  # or the server measured: "llama-server", a URL
    repeats: int = 1  # plain/spec runs per golden (alternating; medians)
    speedup_range: tuple[float, float] | None = None  # min, max of the per-repeat speedups
    # the prediction again with c(n) on the least-squares line 1 + cost_slope (n - 1) through
    # the measured c(n): shows how much of the prediction rests on one noisy c(n)
    predicted_on_line: float | None = None
    cost_slope: float | None = None
    # ms per n-token pass in each c(n) round (a server kolibri timed): the spread behind c(n)
    cost_ms_rounds: dict[int, list[float]] = field(default_factory=dict)
    left_out: int = 0  # goldens too short to time, not in the overall figures nor the worst
    # a guard measuring its own costs started from: "kept" (timings earlier runs of this kernel
    # kept), "bench" (kolibri bench's c(n)) or "none" (it calibrated); None: not such a guard
    guard_costs_from: str | None = None

    @property
    def worst(self) -> MeasuredGolden | None:
        """The golden where speculation fared worst against plain (the guard's figure), of those
        long enough to time."""
        return min((g for g in self.goldens if not g.too_short), key=lambda g: g.speedup,
                   default=None)

    @property
    def prediction_error(self) -> float | None:
        """predicted / measured - 1 (0.1 = the cost model promised 10% too much)."""
        if self.predicted_speedup is None or not self.speedup:
            return None
        return self.predicted_speedup / self.speedup - 1.0

    def to_json(self) -> dict:
        doc = {name: getattr(self, name) for name in self.__dataclass_fields__}
        doc["costs"] = {str(n): c for n, c in sorted(self.costs.items())}
        doc["cost_ms_rounds"] = {str(n): ms for n, ms in sorted(self.cost_ms_rounds.items())}
        doc["prediction_error"] = self.prediction_error
        doc["goldens"] = [vars(g).copy() for g in self.goldens]
        worst = self.worst
        doc["worst"] = None if worst is None else {"id": worst.id, "speedup": worst.speedup,
                                                   "interval": worst.speedup_interval}
        return doc


GUARD_START = {"kept": "timings kept by earlier runs", "bench": "kolibri bench's c(n)",
               "none": "nothing (it calibrated)"}
TOO_SHORT = "too short"  # a golden's cell in the guard report: not timed (MIN_TIMED_STEPS)


def speedup_cell(g: MeasuredGolden) -> str:
    """A golden's measured speedup as the tables show it, marked when too short to time."""
    return fmt_ratio(g.speedup) + (f" ({TOO_SHORT})" if g.too_short else "")
LEFT_OUT = "left out (too short)"


def guard_rows(measured: dict[RunKey, Measured]) -> tuple[list[str], list[list]]:
    """The guard report: measured spec/plain per golden for every measured configuration side by
    side, then overall and the worst golden: ([configuration names], rows [label, x, ...])."""
    names = [f"{p} k={k} window={format_window(w)}" for p, k, w in measured]
    ms = list(measured.values())
    ids = [g.id for g in ms[0].goldens] if ms else []
    rows = [[str(i), *[TOO_SHORT if m.goldens[j].too_short else m.goldens[j].speedup
                       for m in ms]] for j, i in enumerate(ids)]
    rows.append([LEFT_OUT, *[str(m.left_out) for m in ms]])
    rows.append(["overall", *[m.speedup for m in ms]])
    rows.append(["worst", *[m.worst.speedup if m.worst else None for m in ms]])
    rows.append(["worst golden", *[str(m.worst.id) if m.worst else "" for m in ms]])
    rows.append([WORST_INTERVAL, *[interval_text(m.worst) if m.worst else "" for m in ms]])
    return names, rows


WORST_INTERVAL = "worst, 95% interval"


def interval_text(g: MeasuredGolden) -> str:
    """A golden's 95% interval as the guard report shows it ("-" with too few rounds)."""
    if g.speedup_interval is None:
        return "-"
    return " - ".join(fmt_ratio(x) for x in g.speedup_interval)


def guard_json(measured: dict[RunKey, Measured]) -> dict | None:
    """{"configurations": [...], "goldens": {id: [x, ...]}, "overall": [...], "worst": [...]}."""
    if not measured:
        return None
    names, rows = guard_rows(measured)
    per, (left_out, overall, worst, worst_id, _) = rows[:-5], rows[-5:]
    intervals = [m.worst.speedup_interval if m.worst else None for m in measured.values()]
    triples = zip(worst_id[1:], worst[1:], intervals, strict=True)
    return {"configurations": names,
            "goldens": {r[0]: [None if x == TOO_SHORT else x for x in r[1:]] for r in per},
            "left_out": [int(n) for n in left_out[1:]], "overall": overall[1:],
            "worst": [{"id": i, "speedup": x, "interval": None if v is None else list(v)}
                      for i, x, v in triples]}


# ---- JSON ---------------------------------------------------------------------------------


def counts_json(counts: Counts, per_pass: bool = False) -> dict:
    """The counts block shared by totals, categories and goldens."""
    doc = {
        "plain_steps": counts.plain_steps,
        "verify_passes": counts.verify_passes,
        "ratio": counts.ratio,
        "drafts_proposed": counts.drafts_proposed,
        "drafts_accepted": counts.drafts_accepted,
        "passes_with_drafts": counts.passes_with_drafts,
        "acceptance_rate": counts.acceptance_rate,
        "mean_acceptance_length": counts.mean_acceptance_length,
        "drafted_at": counts.drafted_at,
        "accepted_at": counts.accepted_at,
        "accepted_per_position": counts.accepted_per_position,
    }
    if per_pass:
        doc["draft_lengths"] = counts.draft_lengths
        doc["accepted_lengths"] = counts.accepted_lengths
    return doc


def run_json(run: SimRun, best: bool, measured: Measured | None) -> dict:
    """One configuration; "goldens" (per chain) is null when the rows were not kept."""
    goldens = None if run.goldens is None else [
        {"id": g.id, "category": g.category, **counts_json(g.counts, per_pass=True)}
        for g in run.goldens
    ]
    return {
        "proposer": run.proposer,
        "k": run.k,
        "window": list(run.window),
        "best": best,
        "chains": run.chains,
        "ordered_streams": run.streams if run.ordered else None,
        "total": counts_json(run.total),
        "modelled_speedup": run.modelled_speedup(),
        "categories": {name: counts_json(c) for name, c in run.by_category().items()},
        "goldens": goldens,
        "measured": None if measured is None else measured.to_json(),
        "seeds": seeds_json(run),
    }


def seeds_json(run: SimRun) -> dict | None:
    """Mean and spread over sampling seeds, per category and "all" (None: under two seeds)."""
    spread = seed_spread(run)
    if spread is None:
        return None
    return {c: {f: s.to_json() for f, s in figures.items()} for c, figures in spread.items()}


def build_report(
    config: ProbeConfig, runs: list[SimRun], measured: dict[RunKey, Measured] | None = None,
    throughput=None,
) -> dict:
    """The whole JSON document: {"schema_version", "config", "best", "runs": [...]}."""
    measured = measured or {}
    best = best_run(runs)
    return {
        "schema_version": SCHEMA_VERSION,
        "throughput": None if throughput is None else throughput.to_json(),
        "config": config.to_json(),
        "pricing": None if config.pricing is None else config.pricing.to_json(),
        "best": {"proposer": best.proposer, "k": best.k, "window": list(best.window),
                 "ratio": best.total.ratio},
        "comparison": [comparison_json(r, measured.get(run_key(r)))
                       for r in best_per_proposer(runs)],
        "runs": [run_json(r, r is best, measured.get(run_key(r))) for r in runs],
        "guard": guard_json(measured),
    }


def comparison_json(run: SimRun, measured: Measured | None) -> dict:
    """One proposer at its best configuration (by modelled speedup): overall and per category."""

    def figures(c: Counts) -> dict:
        return {"ratio": c.ratio, "acceptance_rate": c.acceptance_rate,
                "mean_acceptance_length": c.mean_acceptance_length,
                "modelled_speedup": run.modelled_speedup(c)}

    return {
        "proposer": run.proposer, "k": run.k, "window": list(run.window), **figures(run.total),
        "categories": {name: figures(c) for name, c in run.by_category().items()},
        "measured_speedup": None if measured is None else measured.speedup,
    }


# ---- gates --------------------------------------------------------------------------------


def check_gates(
    runs: list[SimRun],
    min_ratio: float | None = None,
    min_acceptance: float | None = None,
    min_speedup: float | None = None,
    measured: dict[RunKey, Measured] | None = None,
) -> list[str]:
    """One line per failed gate, naming the figure, its value, the threshold and the run.

    Every run must pass every gate (a sweep gates each configuration); the measured-speedup
    gate applies to the runs that were measured (to every run, failing, if none was)."""
    failures = []
    for run in runs:
        m = (measured or {}).get(run_key(run))
        figures = [
            ("ratio", run.total.ratio, min_ratio, "min-ratio"),
            ("acceptance rate", run.total.acceptance_rate, min_acceptance, "min-acceptance"),
        ]
        if m is not None or not measured:  # a sweep measures its best runs only: gate those
            figures.append(("measured speedup", m and m.speedup, min_speedup, "min-speedup"))
        for name, value, threshold, option in figures:
            if threshold is not None and (value is None or value < threshold):
                shown = "n/a" if value is None else f"{value:.3f}"
                failures.append(f"{name} {shown} < {option} {threshold:g} ({run.name})")
    return failures


# ---- shared formatting --------------------------------------------------------------------


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def fmt_num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def sweep_grid(runs: list[SimRun]) -> tuple[list[int], list[tuple[int, int]], dict[RunKey, SimRun]]:
    """The sweep as a k x window grid: (ks, windows, {(k, window): run}), in run order."""
    ks = list(dict.fromkeys(r.k for r in runs))
    windows = list(dict.fromkeys(r.window for r in runs))
    return ks, windows, {(r.k, r.window): r for r in runs}


COUNT_COLUMNS = ["plain steps", "verify passes", "ratio", "drafts", "accepted", "acceptance"]
COUNT_COLUMNS += ["mean acc. len"]


def count_cells(c: Counts) -> list[str]:
    """The COUNT_COLUMNS cells of one counts row (terminal and Markdown tables share them)."""
    return [
        str(c.plain_steps), str(c.verify_passes), fmt_ratio(c.ratio), str(c.drafts_proposed),
        str(c.drafts_accepted), fmt_pct(c.acceptance_rate), fmt_num(c.mean_acceptance_length),
    ]  # fmt: skip


# ---- Markdown -----------------------------------------------------------------------------


def render_markdown(
    config: ProbeConfig,
    runs: list[SimRun],
    command: str,
    measured: dict[RunKey, Measured] | None = None,
    plot: Path | None = None,
) -> str:
    """A report fit for a PR comment or docs/: the sweep, the best run's details, the command."""
    best = best_run(runs)
    n_goldens = best.chains
    parts = [
        "# kolibri probe: n-gram speculation, simulated\n",
        f"Regenerate with `{clean(command)}`.\n",
        f"{n_goldens} golden chain(s) from {clean(', '.join(str(p) for p in config.goldens))}; "
        f"proposer `{best.proposer}`; counts are exact for greedy decoding (docs/probe.md).\n",
    ]
    if config.pricing is not None:
        parts.append(f"Modelled speedups priced with {clean(config.pricing.line())}.\n")
    ordered = sorted({r.proposer for r in runs if r.ordered})
    if ordered:
        parts.append(f"{', '.join(f'`{p}`' for p in ordered)} share(s) state across requests: "
                     "each golden file is replayed in order as one stream, from a fresh "
                     "state.\n")
    compared = best_per_proposer(runs)
    if len(compared) > 1:
        parts.append(md_comparison(compared, measured, config.pricing))
    same = [r for r in runs if r.proposer == best.proposer]
    if len(same) > 1:
        parts.append(_md_sweep(same, best))
    parts += [
        _md_counts_table(f"Totals ({best.name})", [("all", best.total)], "goldens"),
        _md_positions(best.total),
        _md_counts_table("Per category", list(best.by_category().items()), "category"),
        _md_per_golden(best),
    ]
    spread = seed_spread(best)
    if spread is not None:
        parts.append(md_seeds(spread, best.name))
    for run in compared if len(compared) > 1 else [best]:
        m = (measured or {}).get(run_key(run))
        if m is not None:
            parts.append(_md_measured(m, run.name))
    if measured:
        parts.append(_md_guard(measured))
    if plot is not None:
        parts.append(f"![sweep and per-position acceptance]({plot})\n")
    return "\n".join(parts)


SEED_COLUMNS = ["category", "seeds", "acceptance", "ratio", "modelled speedup"]


def seed_cells(category: str, figures: dict) -> list[str]:
    """One SEED_COLUMNS row: each figure as mean ± sd over seeds."""
    def cell(figure: str, fmt) -> str:
        s = figures[figure]
        return "n/a" if s.mean is None else f"{fmt(s.mean)} ± {fmt(s.sd)}"

    pct = lambda v: fmt_pct(v)  # noqa: E731
    return [category, str(figures[FIGURES[0]].n), cell("acceptance_rate", pct),
            cell("ratio", fmt_ratio), cell("modelled_speedup", fmt_ratio)]


def md_seeds(spread: dict, name: str) -> str:
    rows = [seed_cells(category, figures) for category, figures in spread.items()]
    return (f"## Over sampling seeds ({name})\n\nEach seed's chains give one figure per category; "
            "shown as mean ± standard deviation over seeds.\n\n" + _md_table(SEED_COLUMNS, rows))


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(map(md_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(md_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def md_cell(text) -> str:
    """A Markdown table cell from any text: one line, no escape sequences, `|` escaped."""
    return clean(text).replace("|", "\\|")


def _md_sweep(runs: list[SimRun], best: SimRun) -> str:
    ks, windows, grid = sweep_grid(runs)
    rows = []
    for k in ks:
        cells = []
        for w in windows:
            run = grid.get((k, w))
            cell = "" if run is None else fmt_ratio(run.total.ratio)
            cells.append(f"**{cell}** (best)" if run is best else cell)
        rows.append([f"k={k}", *cells])
    header = [
        "ratio (plain steps / verify passes)",
        *(f"window {format_window(w)}" for w in windows),
    ]
    return "## Sweep\n\n" + _md_table(header, rows)


def _md_counts_table(title: str, rows: list[tuple[str, Counts]], first: str) -> str:
    body = [[name, *count_cells(c)] for name, c in rows]
    return f"## {title}\n\n" + _md_table([first, *COUNT_COLUMNS], body)


def _md_per_golden(run: SimRun) -> str:
    if run.goldens is None:
        return (f"## Per golden\n\nNot listed for {run.chains:,} chains: `--rows FILE` writes "
                "every chain's counts.\n")
    rows = [(f"{g.id} ({g.category})", g.counts) for g in run.goldens]
    return _md_counts_table("Per golden", rows, "golden")


def _md_positions(c: Counts) -> str:
    rows = [
        [str(i + 1), str(d), str(a), fmt_pct(rate)]
        for i, (d, a, rate) in enumerate(
            zip(c.drafted_at, c.accepted_at, c.accepted_per_position, strict=True)
        )
    ]
    return "## Acceptance per draft position\n\n" + _md_table(
        ["position", "drafted", "accepted", "rate"], rows
    )


COMPARISON_COLUMNS = ["proposer", "k", "window", "ratio", "acceptance", "mean acc. len",
                      "modelled speedup"]


def comparison_cells(run: SimRun, measured: Measured | None = None) -> list[str]:
    """One proposer's COMPARISON_COLUMNS cells (terminal and Markdown share them), plus the
    measured speedup and the prediction for it when the run was measured."""
    c = run.total
    cells = [run.proposer, str(run.k), format_window(run.window), fmt_ratio(c.ratio),
             fmt_pct(c.acceptance_rate), fmt_num(c.mean_acceptance_length),
             fmt_ratio(run.modelled_speedup())]
    if measured is not None:
        cells += [fmt_ratio(measured.speedup), fmt_ratio(measured.predicted_speedup)]
    return cells


MEASURED_COLUMNS = ["measured speedup", "predicted (measured c(n))"]


def category_cell(c: Counts) -> str:
    """ratio · acceptance · mean acceptance length of one proposer on one category."""
    return (f"{fmt_ratio(c.ratio)} · {fmt_pct(c.acceptance_rate)} · "
            f"{fmt_num(c.mean_acceptance_length)}")


def md_comparison(compared: list[SimRun], measured: dict[RunKey, Measured] | None,
                  pricing=None) -> str:
    """The proposers side by side, each at its best configuration, overall and per category."""
    found = [(measured or {}).get(run_key(r)) for r in compared]
    header = COMPARISON_COLUMNS + (MEASURED_COLUMNS if any(found) else [])
    rows = [comparison_cells(r, m) + (["not run", ""] if any(found) and m is None else [])
            for r, m in zip(compared, found, strict=True)]
    by_cat = [r.by_category() for r in compared]
    cat_rows = [[name, *(category_cell(cats[name]) for cats in by_cat)] for name in by_cat[0]]
    return ("## Proposers compared\n\nEach proposer at its best configuration by modelled "
            "speedup = plain_steps / sum of c(1 + len(d)), "
            f"{pricing_source(pricing)}; proposer time not "
            "included. `hf` follows the same rule as `vllm` (longest n, leftmost occurrence): "
            "only its defaults differ (k 10, window 1-2).\n\n"
            + _md_table(header, rows) + "\n"
            + "Per category: ratio · acceptance · mean acceptance length.\n\n"
            + _md_table(["category", *(r.proposer for r in compared)], cat_rows))


def _md_guard(measured: dict[RunKey, Measured]) -> str:
    names, rows = guard_rows(measured)
    cells = [[r[0], *[x if isinstance(x, str) else fmt_ratio(x) for x in r[1:]]] for r in rows]
    return ("## Guard: measured spec / plain per golden\n\n"
            + _md_table(["golden", *names], cells))


def _md_measured(m: Measured, name: str = "") -> str:
    server = m.engine != "kolibri"
    rows = [
        ["engine", m.engine + (f" (medians of {m.repeats} runs per golden)" if server else "")],
        ["plain tok/s", fmt_num(m.plain_tokens_per_s)],
        ["spec tok/s", fmt_num(m.spec_tokens_per_s)],
        ["measured speedup", fmt_ratio(m.speedup) + (
            f" ({m.left_out} golden(s) under {MIN_TIMED_STEPS} decode steps, too short to time, "
            "left out)" if m.left_out else "")],
        ["predicted speedup", fmt_ratio(m.predicted_speedup)],
        ["prediction error", fmt_pct(m.prediction_error)],
        ["spec ids == plain ids", "yes" if m.spec_equals_plain else "NO"],
        ["simulated counts == real counts", "yes" if m.counts_match_simulation else "NO"],
        ["c(n)", ", ".join(f"c({n})={c:.2f}" for n, c in sorted(m.costs.items()))],
    ]
    if m.guard_costs_from:
        rows.append(["the guard's costs started from", GUARD_START[m.guard_costs_from]])
    if m.cost_ms_rounds:
        rows.append(["ms per n-token pass (range over c(n) rounds)", ", ".join(
            f"{n}: {min(ms):.1f}-{max(ms):.1f}" for n, ms in sorted(m.cost_ms_rounds.items()))])
    if server and m.predicted_on_line is not None:
        rows.append([f"predicted, c(n) on the line 1 + {m.cost_slope:.3f} (n - 1)",
                     fmt_ratio(m.predicted_on_line)])
    if server and m.speedup_range:
        rows.append(["speedup per repeat", " - ".join(map(fmt_ratio, m.speedup_range))])
    else:
        rows.append(["proposer time per pass", f"{m.proposer_s_per_pass * 1e6:.0f} us"])
    per = [_md_measured_row(g, server) for g in m.goldens]
    header = ["golden", "plain tok/s", "spec tok/s", "speedup", "predicted", "spec == plain",
              *(["drafted server/sim", "accepted server/sim"] if server else []),
              "counts == sim", "model vs golden"]
    title = f"## Measured ({name})" if name else "## Measured"
    return (title + "\n\n" + _md_table(["figure", "value"], rows) + "\n\n"
            + _md_table(header, per))


def _md_measured_row(g: MeasuredGolden, server: bool) -> list[str]:
    counters = [f"{g.drafts_proposed}/{g.simulated_proposed}",
                f"{g.drafts_accepted}/{g.simulated_accepted}"] if server else []
    return [str(g.id), fmt_num(g.plain_tokens_per_s, 1), fmt_num(g.spec_tokens_per_s, 1),
            speedup_cell(g), fmt_ratio(g.predicted_speedup),
            "yes" if g.spec_equals_plain else "NO", *counters,
            "yes" if g.counts_match_simulation else "NO",
            "same" if g.first_divergence is None else f"differs at {g.first_divergence}"]
