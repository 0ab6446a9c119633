"""Terminal and picture rendering of probe results: rich tables, bar charts, a heat table, a PNG.

Scope: presentation only; every figure comes from probe.simulate / probe.report. With cli.py,
the only module that imports rich; matplotlib is optional and imported only for --plot.
"""

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kolibri_cli.atomic import atomic_path
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.report import (
    COMPARISON_COLUMNS,
    MEASURED_COLUMNS,
    category_cell,
    comparison_cells,
    count_cells,
    fmt_pct,
    fmt_ratio,
    run_key,
    sweep_grid,
)
from kolibri_cli.probe.simulate import Counts, SimRun, best_per_proposer, best_run
from kolibri_cli.proposers import format_window

SHORT_COLUMNS = ["plain", "passes", "ratio", "drafts", "acc.", "acc. %", "mean len"]
CAPTION = (
    "plain = plain decode steps (N-1); passes = verify passes; ratio = plain / passes; "
    "mean len = 1 + accepted / passes with drafts"
)
HEAT_STYLES = ["red", "dark_orange", "yellow", "green3", "bold bright_green"]  # low -> high
BAR_WIDTH = 30


def render_probe(runs: list[SimRun], by_category: bool, measured: dict | None = None,
                 console: Console | None = None) -> None:
    """The default terminal report: the sweep (if any), then the best run in detail."""
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
    if len(compared) > 1:
        console.print(comparison_table(compared, measured or {}))
        console.print(comparison_category_table(compared))
    for (proposer, k, window), m in (measured or {}).items():
        console.print(measured_table(m, f"{proposer} k={k} window={format_window(window)}"))


def comparison_table(compared: list[SimRun], measured: dict) -> Table:
    """The proposers side by side, each at its best configuration by modelled speedup."""
    table = Table(title="proposers compared (each at its best configuration)",
                  caption="modelled speedup = plain steps / sum c(1 + len(d)); c(n) from "
                  "--costs or the default 1 + 0.06 (n - 1)")
    found = [measured.get(run_key(r)) for r in compared]
    for col in COMPARISON_COLUMNS + (MEASURED_COLUMNS if any(found) else []):
        table.add_column(col, justify="left" if col == "proposer" else "right")
    speeds = [r.modelled_speedup() or 0.0 for r in compared]
    for run, m, speed in zip(compared, found, speeds, strict=True):
        cells = comparison_cells(run, m) + (["not run", ""] if any(found) and m is None else [])
        table.add_row(*cells, style="bold green" if speed == max(speeds) else None)
    return table


def comparison_category_table(compared: list[SimRun]) -> Table:
    table = Table(title="per category: ratio · acceptance · mean acceptance length")
    table.add_column("category", no_wrap=True)
    for run in compared:
        table.add_column(run.proposer, justify="right")
    by_cat = [r.by_category() for r in compared]
    for name in by_cat[0]:
        cells = [category_cell(r, cats[name]) for r, cats in zip(compared, by_cat, strict=True)]
        table.add_row(name, *cells)
    return table


def goldens_table(run: SimRun) -> Table:
    table = Table(
        title=f"per golden ({run.name})", caption=CAPTION, show_footer=True
    )
    table.add_column("golden", footer=f"total ({len(run.goldens)})", no_wrap=True)
    table.add_column("category", footer="")
    for name, cell in zip(SHORT_COLUMNS, count_cells(run.total), strict=True):
        table.add_column(name, footer=cell, justify="right")
    for g in run.goldens:
        table.add_row(escape(str(g.id)), escape(g.category), *count_cells(g.counts))
    return table


def category_table(run: SimRun) -> Table:
    table = Table(title=f"per category ({run.label})")
    table.add_column("category", no_wrap=True)
    for name in SHORT_COLUMNS:
        table.add_column(name, justify="right")
    for category, counts in run.by_category().items():
        table.add_row(escape(category), *count_cells(counts))
    return table


def sweep_table(runs: list[SimRun], best: SimRun) -> Table:
    """k x window heat table of the ratio; the best cell starred."""
    ks, windows, grid = sweep_grid(runs)
    ratios = [r.total.ratio for r in runs if r.total.ratio is not None]
    low, high = (min(ratios), max(ratios)) if ratios else (0.0, 0.0)
    table = Table(title="ratio = plain steps / verify passes (acceptance rate)")
    table.add_column("k \\ window", justify="right")
    for w in windows:
        table.add_column(format_window(w), justify="right")
    for k in ks:
        cells = [_heat_cell(grid.get((k, w)), best, low, high) for w in windows]
        table.add_row(str(k), *cells)
    return table


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
    table.add_column("rate", justify="left")
    table.add_column("", justify="right")
    table.add_column("accepted/drafted", justify="right")
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


def measured_table(m, label: str) -> Table:
    """Per golden and overall: plain vs spec tok/s, measured vs predicted speedup, checks."""
    table = Table(title=f"measured with the model ({label})", title_justify="left",
                  caption=f"c(n): {', '.join(f'{n}: {c:.2f}' for n, c in sorted(m.costs.items()))}"
                  f"; proposer {m.proposer_s_per_pass * 1e6:.0f} us/pass")
    for col in ("golden", "plain tok/s", "spec tok/s", "speedup", "predicted", "spec==plain",
                "counts==sim", "vs golden"):
        table.add_column(col, justify="left" if col == "golden" else "right")
    yes = lambda ok: "yes" if ok else "[red]NO[/]"  # noqa: E731
    for g in m.goldens:
        diverge = "same" if g.first_divergence is None else f"differs at {g.first_divergence}"
        table.add_row(escape(str(g.id)), f"{g.plain_tokens_per_s:.1f}",
                      f"{g.spec_tokens_per_s:.1f}",
                      fmt_ratio(g.speedup), fmt_ratio(g.predicted_speedup),
                      yes(g.spec_equals_plain), yes(g.counts_match_simulation), diverge)
    table.add_row("[bold]total[/]", f"{m.plain_tokens_per_s:.1f}", f"{m.spec_tokens_per_s:.1f}",
                  fmt_ratio(m.speedup), fmt_ratio(m.predicted_speedup),
                  yes(m.spec_equals_plain), yes(m.counts_match_simulation), "")
    return table
