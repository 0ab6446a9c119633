"""Terminal and picture rendering of probe results: rich tables, bar charts, a heat table, a PNG.

Scope: presentation only; every figure comes from probe.simulate / probe.report. matplotlib is
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
from kolibri_cli.decode.proposers import format_window
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.pricing import source_text
from kolibri_cli.probe.report import (
    COMPARISON_COLUMNS,
    GUARD_START,
    MEASURED_COLUMNS,
    MIN_TIMED_STEPS,
    SEED_COLUMNS,
    category_cell,
    comparison_cells,
    count_cells,
    fmt_pct,
    fmt_ratio,
    guard_rows,
    run_key,
    seed_cells,
    speedup_cell,
    sweep_grid,
)
from kolibri_cli.probe.seeds import seed_spread
from kolibri_cli.probe.simulate import Counts, SimRun, best_per_proposer, best_run
from kolibri_cli.store.atomic import atomic_path

SHORT_COLUMNS = ["plain", "passes", "ratio", "drafts", "acc.", "acc. %", "mean len"]
COUNT_DROP = {"drafts": 6, "acc.": 5, "mean len": 4, "plain": 2, "passes": 1}
CAPTION = (
    "plain = plain decode steps (N-1); passes = verify passes; ratio = plain / passes; "
    "mean len = 1 + accepted / passes with drafts"
)
HEAT_STYLES = ["red", "dark_orange", "yellow", "green3", "bold bright_green"]  # low -> high
BAR_WIDTH = 30


def render_probe(runs: list[SimRun], by_category: bool, measured: dict | None = None,
                 console: Console | None = None, pricing=None) -> None:
    """The default terminal report: the sweep (if any), then the best run in detail, then
    the source of the c(n) it was priced with (`pricing`, a probe.pricing.Pricing)."""
    console = console or Console()
    best = best_run(runs)
    compared = best_per_proposer(runs)
    same = [r for r in runs if r.proposer == best.proposer]
    if len(same) > 1:
        console.print(sweep_table(same, best))
        console.print(f"best: [bold]{best.name}[/] — ratio {fmt_ratio(best.total.ratio)}\n")
    console.print(goldens_table(best))
    if by_category:
        console.print(category_table(best))
    console.print(position_bars(best.total, best.label))
    spread = seed_spread(best)
    if spread is not None:
        console.print(seeds_table(spread, best.label))
    if len(compared) > 1:
        console.print(comparison_table(compared, measured or {}, pricing))
        console.print(comparison_category_table(compared))
    for (proposer, k, window), m in (measured or {}).items():
        console.print(measured_table(m, f"{proposer} k={k} window={format_window(window)}"))
    if measured:
        console.print(guard_table(measured))
    if pricing is not None:
        console.print(cell(pricing.line()))


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
COMPARISON_DROP = {"window": 2, "acceptance": 1, "mean acc. len": 3,
                   "predicted (measured c(n))": 4}


def comparison_table(compared: list[SimRun], measured: dict, pricing=None) -> FitTable:
    """The proposers side by side, each at its best configuration by modelled speedup."""
    found = [measured.get(run_key(r)) for r in compared]
    names = COMPARISON_COLUMNS + (MEASURED_COLUMNS if any(found) else [])
    cols = [Col(n, numeric=n != "proposer", drop=COMPARISON_DROP.get(n, 0)) for n in names]
    speeds = [r.modelled_speedup() or 0.0 for r in compared]
    rows = [comparison_cells(run, m) + (["not run", ""] if any(found) and m is None else [])
            for run, m in zip(compared, found, strict=True)]
    return FitTable("proposers compared (each at its best configuration)", cols, rows,
                    caption="modelled speedup = plain steps / sum c(1 + len(d)); "
                    + source_text(pricing),
                    row_styles=["bold green" if v == max(speeds) else None for v in speeds])


def comparison_category_table(compared: list[SimRun]) -> FitTable:
    by_cat = [r.by_category() for r in compared]
    cols = [Col("category", numeric=False)] + [Col(r.proposer, numeric=False) for r in compared]
    rows = [[cell(name), *(category_cell(cats[name]) for cats in by_cat)] for name in by_cat[0]]
    return FitTable("per category: ratio · acceptance · mean acceptance length", cols, rows)


def _count_cols(footers: list[str] | None = None) -> list[Col]:
    footers = footers or [""] * len(SHORT_COLUMNS)
    return [Col(name, drop=COUNT_DROP.get(name, 0), footer=f)
            for name, f in zip(SHORT_COLUMNS, footers, strict=True)]


def goldens_table(run: SimRun) -> FitTable:
    """Per golden with the total as footer; the total alone when the rows were not kept."""
    cols = [Col("golden", numeric=False, footer=f"total ({run.chains:,})"),
            Col("category", numeric=False, drop=3), *_count_cols(count_cells(run.total))]
    rows = [[cell(g.id), cell(g.category), *count_cells(g.counts)] for g in run.goldens or []]
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
    rows = [[cell(name), *count_cells(c)] for name, c in run.by_category().items()]
    return FitTable(f"per category ({run.label})", cols, rows)


def sweep_table(runs: list[SimRun], best: SimRun) -> FitTable:
    """k x window heat table of the ratio; the best cell starred (cells wrap at their spaces)."""
    ks, windows, grid = sweep_grid(runs)
    ratios = [r.total.ratio for r in runs if r.total.ratio is not None]
    low, high = (min(ratios), max(ratios)) if ratios else (0.0, 0.0)
    cols = [Col("k \\ window")] + [Col(format_window(w), numeric=False) for w in windows]
    rows = [[str(k), *(_heat_cell(grid.get((k, w)), best, low, high) for w in windows)]
            for k in ks]
    return FitTable("ratio = plain steps / verify passes (acceptance rate)", cols, rows)


def _heat_cell(run: SimRun | None, best: SimRun, low: float, high: float) -> Text:
    if run is None:
        return Text("")
    ratio = run.total.ratio
    star = " ★" if run is best else ""
    text = f"{fmt_ratio(ratio)} ({fmt_pct(run.total.acceptance_rate)}){star}"
    if ratio is None:
        return Text(text, style="dim")
    level = 0 if high == low else round((ratio - low) / (high - low) * (len(HEAT_STYLES) - 1))
    return Text(text, style=HEAT_STYLES[level])


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
            "--plot needs matplotlib: pip install 'kolibri[plot]' (or pip install matplotlib)"
        ) from None


def write_plot(path: Path, runs: list[SimRun]) -> None:
    """PNG: ratio over k per window (the sweep), and per-position acceptance of the best run."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_run(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    _plot_sweep(left, [r for r in runs if r.proposer == best.proposer])
    _plot_positions(right, best)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _plot_sweep(ax, runs: list[SimRun]) -> None:
    ks, windows, grid = sweep_grid(runs)
    for w in windows:
        points = [(k, grid[(k, w)].total.ratio or float("nan")) for k in ks if (k, w) in grid]
        ax.plot(*zip(*points, strict=True), marker="o", label=f"window {format_window(w)}")
    ax.set_xlabel("k (draft tokens per pass)")
    ax.set_ylabel("plain steps / verify passes")
    ax.set_title("sweep")
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


def throughput_line(t, configurations: int) -> str:
    """One line: what was simulated, how fast, on how many workers."""
    per = f"{t.steps_per_s / t.workers / 1e6:.2f}M per worker, " if t.workers > 1 else ""
    where = {"local": "1 process", "processes": f"{t.workers} processes",
             "ray": f"Ray, {t.workers} CPUs"}.get(t.executor, t.executor)
    times = f" x {configurations} configurations" if configurations > 1 else ""
    return (f"simulated {t.chains:,} chains{times}: {t.steps / 1e6:.2f}M decode steps in "
            f"{t.seconds:.1f} s — {t.replays_per_s:,.0f} chains/s, "
            f"{t.steps_per_s / 1e6:.2f}M steps/s ({per}{where}; "
            f"{t.steps_per_cpu_s / 1e6:.2f}M steps per CPU-second)")
