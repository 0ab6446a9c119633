"""The probe's outputs: the JSON document (stable schema), the Markdown report, the verdict in
words.

Scope: turning a ProbeResult (and its `Measured`) into JSON and Markdown; the result types are
result.py's. Non-goals:
terminal rendering (cli/), computing the figures or deciding anything (answer.py, result.py).
Schema: docs/probe-json.md. Bump SCHEMA_VERSION on any incompatible change.
"""

from pathlib import Path

from kolibri_cli.costs.pricing import source_text as pricing_source
from kolibri_cli.decode.proposers import format_window
from kolibri_cli.probe.answer import (
    LOSES,
    MIN_GOLDENS,
    PAYS,
    TOO_FEW,
    WASHES,
    RunKey,
    Speed,
    Verdict,
    run_key,
)
from kolibri_cli.probe.load import ENGINE_SETTINGS
from kolibri_cli.probe.result import (
    MIN_TIMED_STEPS,
    Measured,
    MeasuredGolden,
    ProbeResult,
    counts_json,
)
from kolibri_cli.probe.seeds import FIGURES, seed_spread
from kolibri_cli.probe.simulate import Counts, SimRun
from kolibri_cli.text import clean

SCHEMA_VERSION = 2  # 2: runs ranked by speedup ("best" the fastest), the verdict, gates


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


def run_json(run: SimRun, speed: Speed, best: bool, measured: Measured | None) -> dict:
    """One configuration; "goldens" (per chain) is null when the rows were not kept."""
    goldens = None if run.goldens is None else [
        {"id": g.id, "category": g.category, **counts_json(g.counts, per_pass=True),
         "predicted_speedup": run.modelled_speedup(g.counts)}
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
        "predicted_speedup": speed.predicted,
        "modelled_speedup": speed.predicted,  # schema 1's name of predicted_speedup
        "speedup": speed.value,  # what the ranking reads: measured where measured
        "categories": {name: counts_json(c) | {"predicted_speedup": run.modelled_speedup(c)}
                       for name, c in run.by_category().items()},
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


def speed_json(speed: Speed) -> dict:
    """A setting and its speed: the figure the ranking reads, its basis and interval."""
    run, worst = speed.run, speed.worst
    return {"proposer": run.proposer, "k": run.k, "window": list(run.window), "name": run.name,
            "speedup": speed.value, "basis": speed.basis, "predicted_speedup": speed.predicted,
            "measured_speedup": speed.measured,
            "interval": None if speed.interval is None else list(speed.interval),
            "goldens_faster": speed.faster if speed.per_golden else None,
            "goldens": len(speed.per_golden) or None,
            "worst": None if worst is None else {"id": worst[0], "speedup": worst[1]},
            "ratio": run.total.ratio}


def verdict_json(verdict: Verdict, pricing) -> dict:
    interval = verdict.interval
    return {"answer": verdict.answer, "pays": verdict.pays,
            "text": verdict_text(verdict), "setting": speed_json(verdict.speed),
            "interval": None if interval is None else list(interval),
            "spread": None if verdict.spread is None else verdict.spread.to_json(),
            "goldens": verdict.goldens}


def setting_commands(result: ProbeResult):
    """The fastest setting as each engine that runs its rule turns it on (decode.proposers.
    engines), with the switch that turns drafting off above the crossover under --concurrency."""
    from kolibri_cli.decode.proposers.commands import engine_commands

    run, cfg, load = result.best, result.config, result.load
    crossover = None
    if load is not None and load.fastest.run is run and load.crossover != max(load.concurrencies):
        crossover = load.crossover
    return engine_commands(run.proposer, run.k, run.window, cfg.llamacpp_options(),
                           cfg.cross_request, crossover)


def build_report(result: ProbeResult) -> dict:
    """The whole JSON document (schema: docs/probe-json.md)."""
    best, measured, pricing = result.best, result.measured, result.pricing
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": verdict_json(result.verdict, pricing) | {
            "costs": pricing_text(pricing),
            "commands": [c.to_json() for c in setting_commands(result)]},
        "best": speed_json(result.verdict.speed),
        "ranking": [speed_json(s) for s in result.ranked],
        "categories": {name: verdict_json(v, pricing) for name, v in result.categories.items()},
        "gates": [g.to_json() for g in result.gates],
        "gate_failures": result.failures,
        "pricing": None if pricing is None else pricing.to_json(),
        "throughput": None if result.throughput is None else result.throughput.to_json(),
        "config": result.config.to_json(),
        "comparison": [comparison_json(s, measured.get(run_key(s.run)))
                       for s in result.compared],
        "runs": [run_json(r, result.speed_of(r), r is best, measured.get(run_key(r)))
                 for r in result.runs],
        "guard": guard_json(measured),
        "load": None if result.load is None else load_json(result.load, result.pricing),
    }


def load_json(load, pricing) -> dict:
    """--concurrency: per B the fastest setting's figures and the best setting there, every
    setting's speedup, the crossovers and the engines' settings for them."""
    pricing = load.pricing or pricing
    def point(p) -> dict:
        return p.to_json()

    return {
        "text": load_text(load, pricing),
        "concurrency": load.concurrencies,
        "setting": load.fastest.run.name,
        "crossover": load.crossover,
        "best_crossover": load.best_crossover,
        "points": [point(p) for p in load.fastest.points],
        "best_judged": [point(p) for p in load.best_judged],  # the choice re-made at each B
        "best": [{"setting": c.run.name, **point(p)} for c, p in zip(load.best_at,
                                                                      load.best_points,
                                                                      strict=True)],
        "settings": {c.run.name: [p.speedup for p in c.points] for c in load.curves},
        "engines": {engine: {"setting": text, "value": load.crossover}
                    for engine, text in ENGINE_SETTINGS.items()},
        "costs_measured_up_to": max(pricing.costs) if pricing and pricing.costs else None,
        "costs": None if load.pricing is None else load.pricing.to_json(),
        "plain_priced": load.plain_priced,
        "decode": None if load.decode is None else {
            "source": load.decode.source,
            "costs": {str(b): d for b, d in sorted(load.decode.costs.items())}},
    }


def comparison_json(speed: Speed, measured: Measured | None) -> dict:
    """One proposer at its fastest configuration: overall and per category."""
    run = speed.run

    def figures(c: Counts) -> dict:
        predicted = run.modelled_speedup(c)
        return {"ratio": c.ratio, "acceptance_rate": c.acceptance_rate,
                "mean_acceptance_length": c.mean_acceptance_length,
                "modelled_speedup": predicted, "predicted_speedup": predicted}

    return {
        "proposer": run.proposer, "k": run.k, "window": list(run.window), **figures(run.total),
        "speedup": speed.value,
        "interval": None if speed.interval is None else list(speed.interval),
        "categories": {name: figures(c) for name, c in run.by_category().items()},
        "measured_speedup": None if measured is None else measured.speedup,
    }


# ---- the verdict in words -----------------------------------------------------------------


def pricing_text(pricing) -> str:
    """Where the c(n) of every prediction came from, for the verdict's second line; a guess
    says how to measure."""
    text = "predicted with c(n) " + pricing_source(pricing).removeprefix("c(n) ")
    if pricing is not None and pricing.source == "guess" and pricing.hint:
        text += f" — {pricing.hint}"
    return text


def verdict_text(verdict: Verdict) -> str:
    """The answer in one sentence: pays / a wash / does not pay, the setting, by how much."""
    speed = verdict.speed
    where = "here" if verdict.scope == "all" else f"on {clean(str(verdict.scope))}"
    if verdict.slice:  # --where
        where = ("" if verdict.scope == "all" else where + " ") + f"where {clean(verdict.slice)}"
    figure = (f"{speed.basis} speedup {fmt_ratio(speed.value)} over plain decode"
              if speed.value is not None else "no speedup could be computed")
    if verdict.answer == TOO_FEW:
        return (f"n-gram speculation: too few goldens {where} ({verdict.goldens}, under "
                f"{MIN_GOLDENS}) for an interval — its fastest setting, {speed.run.name}, "
                f"{figure}; record more goldens of this kind before turning it on")
    spread = spread_text(verdict)
    counted = ""
    if speed.per_golden and verdict.scope == "all":
        worst = speed.worst
        counted = (f"; {speed.faster} of {len(speed.per_golden)} goldens faster"
                   + ("" if worst is None else
                      f", worst {fmt_ratio(worst[1])} ({clean(str(worst[0]))})"))
    if verdict.answer == PAYS:
        return f"n-gram speculation pays {where}: {speed.run.name}, {figure}{spread}{counted}"
    if verdict.answer == LOSES:
        return (f"n-gram speculation does not pay {where}: its fastest setting, "
                f"{speed.run.name}, {figure}{spread}{counted} — leave it off")
    return (f"n-gram speculation is a wash {where}: its fastest setting, {speed.run.name}, "
            f"{figure}{spread}{counted} — too close to 1.00x to be worth turning on")


def spread_text(verdict: Verdict) -> str:
    """" (95% interval on new traffic 1.02-1.30: the choice 1.05-1.28, c(n) 1.10-1.25)", or
    the speed's own interval where no spread was drawn (measured)."""
    interval, s = verdict.interval, verdict.spread
    if interval is None:
        return ""
    if s is None:
        return f" (95% interval {interval[0]:.2f}-{interval[1]:.2f})"
    parts = [f"{name} {x[0]:.2f}-{x[1]:.2f}" for name, x in (("the choice", s.goldens),
                                                              ("c(n)", s.costs)) if x]
    return (f" (95% interval on new traffic {interval[0]:.2f}-{interval[1]:.2f}"
            + (f": {', '.join(parts)}" if parts else "") + ")")


def load_text(load, pricing=None) -> str:
    """Under load in one or two sentences: the fastest setting's verdict at each B (the rule of
    B = 1, answer.judge), the setting that turns drafting off above the crossover, and a setting
    that pays longer if there is one."""
    curve, cross, pricing = load.fastest, load.crossover, load.pricing or pricing
    name, last = curve.run.name, curve.points[-1]
    text = f"under load: {name} {per_b_text(curve.points)}"
    if cross is not None and cross < last.concurrency:
        text += f"; above B = {cross}, turn it off — vLLM: disable_by_batch_size={cross}"
    elif cross is None and all(p.answer in (LOSES, WASHES) for p in curve.points):
        text += " — leave it off"
    longer = [c for c in load.best_at if c is not curve]
    if load.best_crossover is not None and (cross is None or load.best_crossover > cross) \
            and longer:
        other = max(longer, key=lambda c: crossover_of(c))
        text += (f"; {other.run.name} pays longer, up to B = {crossover_of(other)}"
                 if crossover_of(other) else "")
    top = max(load.concurrencies) * (max(c.run.k for c in load.curves) + 1)
    if pricing is not None and pricing.costs and max(pricing.costs) < top:
        text += (f" (c(T) known up to T = {max(pricing.costs)}, extrapolated to {top}: "
                 "`--costs measure` times the curve)")
    return f"{text}; {load.plain_priced}"


def per_b_text(points: list) -> str:
    """"pays at B = 1-4 (1.21x-1.08x), a wash at B = 8 (1.01x), does not pay at B = 16-64
    (0.93x-0.71x)": the answer per B, runs of the same answer together."""
    runs: list[list] = []
    for p in points:
        if runs and runs[-1][0].answer == p.answer:
            runs[-1].append(p)
        else:
            runs.append([p])
    return ", ".join(
        f"{(r[0].answer or 'predicted')} at B = {r[0].concurrency}"
        + (f"-{r[-1].concurrency}" if len(r) > 1 else "")
        + f" ({fmt_ratio(r[0].speedup)}" + (f"-{fmt_ratio(r[-1].speedup)})" if len(r) > 1
                                            else ")")
        for r in runs)


def crossover_of(curve) -> int:
    from kolibri_cli.probe.load import crossover

    return crossover(curve) or 0


def category_line(categories: dict[str, Verdict]) -> str:
    """Where it pays and where it does not, one clause per category."""
    clauses = [f"{v.answer} on {clean(str(name))} ({fmt_ratio(v.speed.value)}"
               + (f" with {v.speed.run.name})" if v.pays else
                  f", {v.goldens} golden{'s' * (v.goldens != 1)})" if v.answer == TOO_FEW
                  else ")")
               for name, v in categories.items()]
    return "by category: " + "; ".join(clauses)


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


def render_markdown(result: ProbeResult, command: str, plot: Path | None = None) -> str:
    """A report fit for a PR comment or docs/: the verdict first, then the ranking's evidence
    (the comparison, the sweep, the fastest setting's details), the command."""
    best, config, measured = result.best, result.config, result.measured
    parts = [
        "# kolibri probe: would n-gram speculation pay?\n",
        f"**{clean(verdict_text(result.verdict))}.**\n",
        f"{clean(pricing_text(result.pricing))}.\n",
    ]
    if result.pricing is not None:
        parts.append(f"Predicted speedups priced with {clean(result.pricing.line())}.\n")
    if config.by_category and len(result.categories) > 1:
        parts.append(f"{clean(category_line(result.categories))}.\n")
    if result.load is not None:
        parts.append(f"{clean(load_text(result.load, result.pricing))}.\n")
    parts += [
        f"Regenerate with `{clean(command)}`.\n",
        f"{best.chains} golden chain(s) from "
        f"{clean(', '.join(str(p) for p in config.goldens))}; settings ranked by "
        f"{result.verdict.speed.basis} speedup over plain decode; counts are exact for greedy "
        "decoding (docs/simulation.md).\n",
    ]
    ordered = sorted({r.proposer for r in result.runs if r.ordered})
    if ordered:
        parts.append(f"{', '.join(f'`{p}`' for p in ordered)} share(s) state across requests: "
                     "each golden file is replayed in order as one stream, from a fresh "
                     "state.\n")
    if len(result.compared) > 1:
        parts.append(md_comparison(result))
    same = [r for r in result.runs if r.proposer == best.proposer]
    if len(same) > 1:
        parts.append(_md_sweep(result, same))
    parts += [
        _md_counts_table(f"Totals ({best.name})", [("all", best.total)], "goldens", best),
        _md_positions(best.total),
        _md_counts_table("Per category", list(best.by_category().items()), "category", best),
        _md_per_golden(best),
    ]
    spread = seed_spread(best)
    if spread is not None:
        parts.append(md_seeds(spread, best.name))
    for speed in result.compared if len(result.compared) > 1 else [result.verdict.speed]:
        m = measured.get(run_key(speed.run))
        if m is not None:
            parts.append(_md_measured(m, speed.run.name))
    if measured:
        parts.append(_md_guard(measured))
    if result.load is not None:
        parts.append(md_load(result.load, result.pricing))
    if plot is not None:
        parts.append(f"![predicted speedup over k, and per-position acceptance]({plot})\n")
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


def _md_sweep(result: ProbeResult, runs: list[SimRun]) -> str:
    ks, windows, grid = sweep_grid(runs)
    rows = []
    for k in ks:
        cells = []
        for w in windows:
            run = grid.get((k, w))
            cell = "" if run is None else sweep_cell(result.speed_of(run))
            cells.append(f"**{cell}** ★" if run is result.best else cell)
        rows.append([f"k={k}", *cells])
    header = ["speedup (ratio, acceptance)", *(f"window {format_window(w)}" for w in windows)]
    return ("## Sweep\n\nPredicted speedup over plain decode of each setting (the pass ratio and "
            "acceptance that explain it); ★ the fastest.\n\n" + _md_table(header, rows))


def sweep_cell(speed: Speed) -> str:
    """A sweep cell: the speedup, then the ratio and acceptance behind it."""
    c = speed.run.total
    return f"{fmt_ratio(speed.value)} ({fmt_ratio(c.ratio)}, {fmt_pct(c.acceptance_rate)})"


def _md_counts_table(title: str, rows: list[tuple[str, Counts]], first: str,
                     run: SimRun) -> str:
    body = [[name, *speed_count_cells(run, c)] for name, c in rows]
    return f"## {title}\n\n" + _md_table([first, *SPEED_COLUMNS], body)


def _md_per_golden(run: SimRun) -> str:
    if run.goldens is None:
        return (f"## Per golden\n\nNot listed for {run.chains:,} chains: `--rows FILE` writes "
                "every chain's counts.\n")
    rows = [(f"{g.id} ({g.category})", g.counts) for g in run.goldens]
    return _md_counts_table("Per golden", rows, "golden", run)


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


SPEED_COLUMNS = ["speedup", *COUNT_COLUMNS]


def speed_count_cells(run: SimRun, c: Counts) -> list[str]:
    """The predicted speedup of `c` under the run's c(n), then its COUNT_COLUMNS cells."""
    return [fmt_ratio(run.modelled_speedup(c)), *count_cells(c)]


COMPARISON_COLUMNS = ["proposer", "k", "window", "speedup", "95% interval", "ratio",
                      "acceptance", "mean acc. len"]


def interval_cell(speed: Speed) -> str:
    return "-" if speed.interval is None else "-".join(f"{x:.2f}" for x in speed.interval)


def comparison_cells(speed: Speed, measured: Measured | None = None) -> list[str]:
    """One proposer's COMPARISON_COLUMNS cells (terminal and Markdown share them), plus the
    measured speedup and the prediction for it when the run was measured."""
    run, c = speed.run, speed.run.total
    cells = [run.proposer, str(run.k), format_window(run.window), fmt_ratio(speed.value),
             interval_cell(speed), fmt_ratio(c.ratio), fmt_pct(c.acceptance_rate),
             fmt_num(c.mean_acceptance_length)]
    if measured is not None:
        cells += [fmt_ratio(speed.predicted), fmt_ratio(measured.predicted_speedup)]
    return cells


MEASURED_COLUMNS = ["predicted (c(n) above)", "predicted (measured c(n))"]


def category_cell(run: SimRun, c: Counts) -> str:
    """speedup · ratio · acceptance · mean acceptance length of one setting on one category."""
    return (f"{fmt_ratio(run.modelled_speedup(c))} · {fmt_ratio(c.ratio)} · "
            f"{fmt_pct(c.acceptance_rate)} · {fmt_num(c.mean_acceptance_length)}")


CATEGORY_CAPTION = "Per category: predicted speedup · ratio · acceptance · mean acceptance length."


def md_comparison(result: ProbeResult) -> str:
    """The proposers side by side, each at its fastest configuration, overall and per
    category; the fastest starred."""
    compared, measured = result.compared, result.measured
    found = [measured.get(run_key(s.run)) for s in compared]
    header = COMPARISON_COLUMNS + (MEASURED_COLUMNS if any(found) else [])
    rows = [comparison_cells(s, m) + (["not run", ""] if any(found) and m is None else [])
            for s, m in zip(compared, found, strict=True)]
    rows = [[f"{r[0]} ★" if s.run is result.best else r[0], *r[1:]]
            for r, s in zip(rows, compared, strict=True)]
    runs = [s.run for s in compared]
    by_cat = [r.by_category() for r in runs]
    cat_rows = [[name, *(category_cell(r, cats[name]) for r, cats in zip(runs, by_cat,
                                                                         strict=True))]
                for name in by_cat[0]]
    basis = result.verdict.speed.basis
    return ("## Proposers compared\n\nEach proposer at its fastest configuration, by "
            f"{basis} speedup; predicted speedup = plain_steps / sum of c(1 + len(d)), "
            f"{pricing_source(result.pricing)}; proposer time not included. `hf` follows the "
            "same rule as `vllm` (longest n, leftmost occurrence): only its defaults differ "
            "(k 10, window 1-2).\n\n"
            + _md_table(header, rows) + "\n" + CATEGORY_CAPTION + "\n\n"
            + _md_table(["category", *(r.proposer for r in runs)], cat_rows))


LOAD_COLUMNS = ["B", "speedup", "95% interval", "verdict", "tokens / step", "tokens in flight",
                "acceptance", "per sequence", "fastest setting at B", "its speedup"]


def load_rows(load) -> list[list[str]]:
    """One LOAD_COLUMNS row per concurrency (terminal and Markdown share them)."""
    return [[f"{b} ({p.basis})" if p.basis != "predicted" else str(b), fmt_ratio(p.speedup),
             "-" if p.interval is None else "-".join(f"{x:.2f}" for x in p.interval),
             p.answer or "-", fmt_num(p.tokens_per_step, 1), fmt_num(p.in_flight, 1),
             fmt_pct(p.acceptance), fmt_ratio(p.per_sequence), best.run.name,
             fmt_ratio(best.at(b).speedup)]
            for b, p, best in zip(load.concurrencies, load.fastest.points, load.best_at,
                                  strict=True)]


LOAD_CAPTION = ("B sequences at once, each step one forward over every token in flight at "
                "c(tokens); speedup = spec throughput / plain throughput at the same B; per "
                "sequence = one sequence's speed relative to plain decoding alone (B = 1); "
                "prefill left out (docs/load.md)")


def md_load(load, pricing) -> str:
    return (f"## Under load ({load.fastest.run.name})\n\n{LOAD_CAPTION}.\n\n"
            + _md_table(LOAD_COLUMNS, load_rows(load)))


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
