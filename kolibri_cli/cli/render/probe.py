"""Terminal and picture rendering of probe results: rich tables, bar charts, a heat table, a PNG.

Scope: presentation only; every figure comes from probe.result / probe.report. matplotlib is
optional and imported only for --plot.
"""

import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from kolibri_cli.cli.render import Col, FitTable, cell, err
from kolibri_cli.costs.pricing import source_text
from kolibri_cli.decode.proposers import format_window
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.answer import LOSES, PAYS, TOO_FEW, WASHES, run_key
from kolibri_cli.probe.report import (
    COMPARISON_COLUMNS,
    GUARD_START,
    LOAD_CAPTION,
    LOAD_COLUMNS,
    MEASURED_COLUMNS,
    SEED_COLUMNS,
    category_cell,
    category_line,
    comparison_cells,
    fmt_pct,
    fmt_ratio,
    guard_rows,
    load_rows,
    load_text,
    pricing_text,
    seed_cells,
    setting_commands,
    speed_count_cells,
    speedup_cell,
    sweep_cell,
    sweep_grid,
    verdict_text,
)
from kolibri_cli.probe.result import MIN_TIMED_STEPS, ProbeResult
from kolibri_cli.probe.seeds import seed_spread
from kolibri_cli.probe.simulate import Counts, SimRun
from kolibri_cli.store.atomic import atomic_path

SHORT_COLUMNS = ["speedup", "plain", "passes", "ratio", "drafts", "acc.", "acc. %", "mean len"]
COUNT_DROP = {"drafts": 6, "acc.": 5, "mean len": 4, "plain": 2, "passes": 1}
CAPTION = (
    "speedup = predicted over plain decode, plain steps / sum c(1 + drafted) per pass; "
    "plain = plain decode steps (N-1); passes = verify passes; ratio = plain / passes; "
    "mean len = 1 + accepted / passes with drafts"
)
HEAT_STYLES = ["red", "dark_orange", "yellow", "green3", "bold bright_green"]  # low -> high
ANSWER_STYLES = {PAYS: "bold green", WASHES: "bold yellow", LOSES: "bold red",
                 TOO_FEW: "bold yellow"}
BAR_WIDTH = 30


def render_probe(result: ProbeResult, console: Console | None = None) -> None:
    """The terminal report: the verdict and where its c(n) came from first, then the evidence —
    the comparison and the sweep (the fastest starred), the fastest setting in detail."""
    console = console or Console()
    best, measured = result.best, result.measured
    console.print(verdict_lines(result))
    if result.verdict.pays:
        commands, notes = command_lines(setting_commands(result))
        console.print(commands, soft_wrap=True)  # whole, to paste
        console.print(notes)
    same = [r for r in result.runs if r.proposer == best.proposer]
    if len(result.compared) > 1:
        console.print(comparison_table(result))
        console.print(comparison_category_table(result))
    if len(same) > 1:
        console.print(sweep_table(result, same))
    console.print(goldens_table(best))
    if result.config.by_category:
        console.print(category_table(best))
    console.print(position_bars(best.total, best.label))
    spread = seed_spread(best)
    if spread is not None:
        console.print(seeds_table(spread, best.label))
    for (proposer, k, window), m in measured.items():
        console.print(measured_table(m, f"{proposer} k={k} window={format_window(window)}"))
    if measured:
        console.print(guard_table(measured))
    if result.load is not None:
        console.print(load_table(result.load))


def load_table(load) -> FitTable:
    """--concurrency: the fastest setting per B, and which setting is fastest at each B."""
    cols = [Col(n, numeric=n not in ("fastest setting at B", "verdict"),
                drop={"tokens in flight": 3, "acceptance": 2, "per sequence": 1,
                      "95% interval": 4}.get(n, 0))
            for n in LOAD_COLUMNS]
    rows = [[r[0], _guard_cell(p.speedup), *r[2:]] for r, p in zip(load_rows(load),
                                                                   load.fastest.points,
                                                                   strict=True)]
    return FitTable(f"under load ({load.fastest.run.name})", cols, rows, title_justify="left",
                    caption=LOAD_CAPTION)


def verdict_lines(result: ProbeResult) -> Text:
    """The answer (styled by what it says), where c(n) came from, and by category if asked."""
    text = Text(verdict_text(result.verdict), style=ANSWER_STYLES[result.verdict.answer])
    text.append("\n" + pricing_text(result.pricing), style="dim")
    if result.pricing is not None:
        text.append("\n" + result.pricing.priced_line(), style="dim")
    if result.config.by_category and len(result.categories) > 1:
        text.append("\n" + category_line(result.categories))
    if result.load is not None:
        text.append("\n" + load_text(result.load, result.pricing))
    return text.append("\n")


def command_lines(commands) -> tuple[Text, Text]:
    """The fastest setting as the command each engine turns it on with, then (under load) the
    switch that turns drafting off above the crossover; and the notes: where an engine's rule
    differs, which engines have no switch by load."""
    width = max(len(c.engine) for c in commands) + 2
    text = Text("turn it on with:", style="bold")
    for c in commands:
        text.append(f"\n  {c.engine:<{width}}{c.command or '(no equivalent: see below)'}")
    off = [c for c in commands if c.off_above]
    if off:
        text.append("\nabove the crossover, turn it off with:", style="bold")
        for c in off:
            text.append(f"\n  {c.engine:<{width}}{c.off_above}")
    notes = [f"{c.engine}: {c.note}" for c in commands if c.note]
    if none := off and [c.engine for c in commands if not c.off_above and c.command]:
        notes.append(f"{', '.join(none)}: no switch by load (start it without the flags where "
                     "the load stays above the crossover)")
    return text, Text("\n".join(notes) + "\n", style="dim")


def guard_table(measured: dict) -> FitTable:
    """Measured spec / plain per golden, each configuration side by side; overall and worst."""
    names, rows = guard_rows(measured)
    cols = [Col("golden", numeric=False), *[Col(n) for n in names]]
    cells = [[cell(r[0]), *[cell(x) if isinstance(x, str) else _guard_cell(x) for x in r[1:]]]
             for r in rows]
    return FitTable("guard: measured spec / plain per golden", cols, cells, title_justify="left",
                    caption="below 1.00x: speculation made that golden slower than plain")


def _guard_cell(x: float | None) -> str:
    return fmt_ratio(x) if x is None or x >= 1.0 else f"[red]{fmt_ratio(x)}[/]"


def seeds_table(spread: dict, label: str) -> FitTable:
    """Per category: acceptance, ratio and modelled speedup as mean ± sd over sampling seeds."""
    cols = [Col(n, numeric=n != "category") for n in SEED_COLUMNS]
    rows = [[cell(c) for c in seed_cells(category, figures)]
            for category, figures in spread.items()]
    return FitTable(f"over sampling seeds ({label}): mean ± sd", cols, rows, title_justify="left")


# Column drop ranks when the terminal is narrow: derived counts go first, the verdicts last.
COMPARISON_DROP = {"window": 2, "acceptance": 1, "mean acc. len": 3, "95% interval": 5,
                   "predicted (c(n) above)": 6, "predicted (measured c(n))": 4}


def comparison_table(result: ProbeResult) -> FitTable:
    """The proposers side by side, each at its fastest configuration; the fastest starred."""
    compared, measured = result.compared, result.measured
    found = [measured.get(run_key(s.run)) for s in compared]
    names = COMPARISON_COLUMNS + (MEASURED_COLUMNS if any(found) else [])
    cols = [Col(n, numeric=n != "proposer", drop=COMPARISON_DROP.get(n, 0)) for n in names]
    rows = [comparison_cells(s, m) + (["not run", ""] if any(found) and m is None else [])
            for s, m in zip(compared, found, strict=True)]
    rows = [[f"{r[0]} ★" if s.run is result.best else r[0], *r[1:]]
            for r, s in zip(rows, compared, strict=True)]
    return FitTable("proposers compared (each at its fastest configuration)", cols, rows,
                    caption=f"speedup: {result.verdict.speed.basis} over plain decode; "
                    "predicted = plain steps / sum c(1 + len(d)); " + source_text(result.pricing),
                    row_styles=["bold green" if s.run is result.best else None
                                for s in compared])


def comparison_category_table(result: ProbeResult) -> FitTable:
    runs = [s.run for s in result.compared]
    by_cat = [r.by_category() for r in runs]
    cols = [Col("category", numeric=False)] + [Col(r.proposer, numeric=False) for r in runs]
    rows = [[cell(name), *(category_cell(r, cats[name]) for r, cats in zip(runs, by_cat,
                                                                           strict=True))]
            for name in by_cat[0]]
    return FitTable("per category: predicted speedup · ratio · acceptance · mean acceptance "
                    "length", cols, rows)


def _count_cols(footers: list[str] | None = None) -> list[Col]:
    footers = footers or [""] * len(SHORT_COLUMNS)
    return [Col(name, drop=COUNT_DROP.get(name, 0), footer=f)
            for name, f in zip(SHORT_COLUMNS, footers, strict=True)]


def goldens_table(run: SimRun) -> FitTable:
    """Per golden with the total as footer; the total alone when the rows were not kept."""
    cols = [Col("golden", numeric=False, footer=f"total ({run.chains:,})"),
            Col("category", numeric=False, drop=3),
            *_count_cols(speed_count_cells(run, run.total))]
    rows = [[cell(g.id), cell(g.category), *speed_count_cells(run, g.counts)]
            for g in run.goldens or []]
    caption = CAPTION + ("" if run.goldens is not None else
                         f"; per-golden rows of {run.chains:,} chains not shown (--rows FILE "
                         "writes them)")
    if run.ordered:
        caption += f"; {run.proposer} shares state across requests: {stream_note(run)}"
    title = f"per golden ({run.name})" if run.goldens is not None else f"total ({run.name})"
    return FitTable(title, cols, rows, caption=caption)


def stream_note(run: SimRun) -> str:
    return (f"replayed in order, one stream per golden file ({run.streams:,}), each from a "
            "fresh state")


def category_table(run: SimRun) -> FitTable:
    cols = [Col("category", numeric=False), *_count_cols()]
    rows = [[cell(name), *speed_count_cells(run, c)] for name, c in run.by_category().items()]
    return FitTable(f"per category ({run.label})", cols, rows)


def sweep_table(result: ProbeResult, runs: list[SimRun]) -> FitTable:
    """k x window heat table of the predicted speedup (ratio and acceptance beside it); the
    fastest cell starred (cells wrap at their spaces)."""
    ks, windows, grid = sweep_grid(runs)
    speeds = [v for r in runs if (v := result.speed_of(r).value) is not None]
    low, high = (min(speeds), max(speeds)) if speeds else (0.0, 0.0)
    cols = [Col("k \\ window")] + [Col(format_window(w), numeric=False) for w in windows]
    rows = [[str(k), *(_heat_cell(result, grid.get((k, w)), low, high) for w in windows)]
            for k in ks]
    return FitTable(f"{runs[0].proposer}: speedup over plain (ratio, acceptance); "
                    "★ the fastest", cols, rows)


def _heat_cell(result: ProbeResult, run: SimRun | None, low: float, high: float) -> Text:
    if run is None:
        return Text("")
    speed = result.speed_of(run)
    text = sweep_cell(speed) + (" ★" if run is result.best else "")
    if speed.value is None:
        return Text(text, style="dim")
    level = 0 if high == low else round((speed.value - low) / (high - low)
                                        * (len(HEAT_STYLES) - 1))
    return Text(text, style=HEAT_STYLES[level] if speed.value >= 1.0 else "red")


def position_bars(counts: Counts, label: str) -> Table:
    """Acceptance rate per draft position as terminal bars."""
    table = Table(title=f"acceptance per draft position ({label})", box=None)
    table.add_column("pos", justify="right")
    table.add_column("rate", justify="left", no_wrap=True, overflow="crop")  # a bar may crop
    table.add_column("", justify="right")
    table.add_column("acc./drafted", justify="right", no_wrap=True)
    for i, rate in enumerate(counts.accepted_per_position):
        bar = Text(bar_string(rate or 0.0, BAR_WIDTH), style="cyan")
        table.add_row(
            str(i + 1), bar, fmt_pct(rate), f"{counts.accepted_at[i]}/{counts.drafted_at[i]}"
        )
    return table


def bar_string(fraction: float, width: int) -> str:
    """A bar of `width` cells filled to `fraction`, with eighth-cell resolution."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part else ""
    return ("█" * full + partial).ljust(width, "·")


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise KolibriError(
            "--plot needs matplotlib: pip install 'kolibri-cli[plot]' (or pip install matplotlib)"
        ) from None


def write_plot(path: Path, result: ProbeResult) -> None:
    """PNG: predicted speedup over k per window (the sweep) with the 1.0x line, and
    per-position acceptance of the fastest run."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = result.best
    panels = 3 if result.load is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    _plot_sweep(axes[0], result, [r for r in result.runs if r.proposer == best.proposer])
    _plot_positions(axes[1], best)
    if result.load is not None:
        _plot_load(axes[2], result.load)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _plot_sweep(ax, result: ProbeResult, runs: list[SimRun]) -> None:
    ks, windows, grid = sweep_grid(runs)
    for w in windows:
        points = [(k, result.speed_of(grid[(k, w)]).value or float("nan")) for k in ks
                  if (k, w) in grid]
        ax.plot(*zip(*points, strict=True), marker="o", label=f"window {format_window(w)}")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="plain decode (1.0x)")
    best = result.speed_of(result.best)
    if best.value is not None:
        ax.plot([result.best.k], [best.value], marker="*", markersize=16, color="gold",
                markeredgecolor="black", linestyle="none", label=f"fastest: {result.best.label}")
    ax.set_xlabel("k (draft tokens per pass)")
    ax.set_ylabel(f"{best.basis} speedup over plain")
    ax.set_title(f"{result.best.proposer}: speedup by setting")
    ax.grid(alpha=0.3)
    ax.legend()


def _plot_load(ax, load) -> None:
    """Speedup over concurrency (log2 axis) with the 1.0x line: the fastest setting at B = 1,
    and the best setting at each B."""
    bs = load.concurrencies
    ax.plot(bs, [p.speedup for p in load.fastest.points], marker="o",
            label=load.fastest.run.name)
    ax.plot(bs, [p.speedup for p in load.best_points], marker=".", linestyle=":",
            label="the fastest setting at each B")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="plain decode (1.0x)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency B (sequences at once)")
    ax.set_ylabel("throughput speedup over plain")
    ax.set_title("under load")
    ax.grid(alpha=0.3)
    ax.legend()


def _plot_positions(ax, run: SimRun) -> None:
    rates = [r or 0.0 for r in run.total.accepted_per_position]
    ax.bar(range(1, len(rates) + 1), rates, color="tab:cyan")
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted")
    ax.set_title(f"acceptance per position ({run.label})")


MEASURED_DROP = {"plain tok/s": 3, "spec tok/s": 4, "counts==sim": 2, "vs golden": 1,
                 "drafted srv/sim": 5, "accepted srv/sim": 6}


def measured_table(m, label: str) -> FitTable:
    """Per golden and overall: plain vs spec tok/s, measured vs predicted speedup, checks; on a
    server, its own draft counters beside kolibri's simulated ones."""
    server = m.engine != "kolibri"
    counters = ("drafted srv/sim", "accepted srv/sim") if server else ()
    names = ("golden", "plain tok/s", "spec tok/s", "speedup", "predicted", "spec==plain",
             *counters, "counts==sim", "vs golden")
    cols = [Col(n, numeric=n not in ("golden", "vs golden"), drop=MEASURED_DROP.get(n, 0))
            for n in names]
    rows = [_measured_row(g, server) for g in m.goldens]
    total = [[f"{sum(g.drafts_proposed for g in m.goldens)}/"
              f"{sum(g.simulated_proposed or 0 for g in m.goldens)}",
              f"{sum(g.drafts_accepted for g in m.goldens)}/"
              f"{sum(g.simulated_accepted or 0 for g in m.goldens)}"]] if server else [[]]
    rows.append(["[bold]total[/]", f"{m.plain_tokens_per_s:.1f}", f"{m.spec_tokens_per_s:.1f}",
                 fmt_ratio(m.speedup), fmt_ratio(m.predicted_speedup), _yes(m.spec_equals_plain),
                 *total[0], _yes(m.counts_match_simulation), ""])
    costs = ", ".join(f"{n}: {c:.2f}" for n, c in sorted(m.costs.items())) or "not measured"
    if server:
        low, high = m.speedup_range or (m.speedup, m.speedup)
        title = f"measured on {m.engine} ({label}; medians of {m.repeats})"
        line = "" if m.predicted_on_line is None else (
            f"; on the least-squares line c(n) = 1 + {m.cost_slope:.3f} (n - 1) the prediction "
            f"is {m.predicted_on_line:.2f}x")
        caption = (f"c(n) of the server's decode loop: {costs}{line}; speedup per repeat "
                   f"{low:.2f}x-{high:.2f}x; srv = the server's draft counters")
    else:
        title = f"measured with the model ({label})"
        caption = f"c(n): {costs}; proposer {m.proposer_s_per_pass * 1e6:.0f} us/pass"
    if m.left_out:
        caption += (f"; {m.left_out} golden(s) too short to time (under {MIN_TIMED_STEPS} "
                    "decode steps) left out of the total")
    if m.guard_costs_from:
        caption += f"; the guard's costs started from {GUARD_START[m.guard_costs_from]}"
    return FitTable(title, cols, rows, title_justify="left", caption=caption)


def _yes(ok: bool) -> str:
    return "yes" if ok else "[red]NO[/]"


def _measured_row(g, server: bool) -> list[str]:
    counters = [f"{g.drafts_proposed}/{g.simulated_proposed}",
                f"{g.drafts_accepted}/{g.simulated_accepted}"] if server else []
    return [cell(g.id), f"{g.plain_tokens_per_s:.1f}", f"{g.spec_tokens_per_s:.1f}",
            speedup_cell(g), fmt_ratio(g.predicted_speedup), _yes(g.spec_equals_plain),
            *counters, _yes(g.counts_match_simulation),
            "same" if g.first_divergence is None else f"differs at {g.first_divergence}"]


class _Bar:
    shown = False
    update = None


@contextmanager
def throughput_bar(delay: float = 1.0):
    """A bar on stderr driven by `update(Throughput)`: share of the input read (and the ETA),
    chains and chains/s, decode steps/s. It appears only after `delay` seconds and is gone when
    the run ends (`shown` says whether it was up)."""
    columns = (TextColumn("simulating"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn())
    bar, handle, state = Progress(*columns, console=err, transient=True), _Bar(), {}
    started = time.monotonic()

    def update(t) -> None:
        if not handle.shown:
            if time.monotonic() - started < delay:
                return
            bar.start()
            handle.shown = True
            state["task"] = bar.add_task("", total=max(t.total_bytes, 1), rate="")
        rate = (f"{t.chains:,} chains · {t.replays_per_s:,.0f} chains/s · "
                f"{t.steps_per_s / 1e6:.2f}M steps/s")
        bar.update(state["task"], completed=t.done_bytes, rate=rate)

    handle.update = update
    try:
        yield handle
    finally:
        if handle.shown:
            bar.stop()
