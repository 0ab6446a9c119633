"""Rendering for the CLI: rich tables, progress bars and the streaming text printer.

Progress and statistics go to stderr; stdout carries only the generated text or the JSON.
"""

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

err = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)


@contextmanager
def progress_bar(description: str = ""):
    """Yield a callback (stage, done, total) that drives one bar per stage on stderr.

    The bar starts with its first update, so a command that fails early prints nothing but
    its error line."""
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TimeRemainingColumn())
    bar = Progress(*columns, console=err, transient=False)
    tasks: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if stage not in tasks:
            tasks[stage] = bar.add_task(f"{description}{stage}", total=total)
        bar.update(tasks[stage], completed=done, total=total)

    try:
        yield update
    finally:
        if tasks:
            bar.stop()


class TextStreamer:
    """Prints decoded text as ids arrive, holding back an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, new_ids: list[int]) -> None:
        self.ids += new_ids
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids)
        sys.stdout.write(text[self.printed :] + "\n")
        sys.stdout.flush()


def kv_table(title: str, rows: list[tuple[str, object]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def table(title: str, columns: list[str], rows: list[list[object]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right" if c not in (columns[0],) else "left")
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def check_table(results) -> Table:
    rows = []
    for r in results:
        if r.identical:
            rows.append([escape(str(r.id)), r.tokens, "identical", "", "", ""])
        else:
            margin = "" if r.reference_margin is None else f"{r.reference_margin:.2e}"
            verdict = "near-tie" if r.explained else "DIVERGES"
            pair = f"{r.ours} vs {r.reference}"
            rows.append([escape(str(r.id)), r.tokens, verdict, r.index, pair, margin])
    return table("kolibri vs golden", ["id", "tokens", "result", "index", "ours vs ref",
                                       "ref margin"], rows)


def bench_table(r) -> Table:
    rows = [
        ("model", f"{r.model} ({r.threads} threads, medians of {r.repeats})"),
        ("read bandwidth", f"{r.bandwidth_gb_s:.1f} GB/s"),
        ("weights per token", f"{r.bytes_per_token / 1e6:.0f} MB"),
        ("bandwidth bound", f"{r.bound_tokens_per_s:.1f} tok/s"),
        ("plain decode",
         f"{r.plain_tokens_per_s:.1f} tok/s = {r.fraction_of_bound:.0%} of the bound"),
        ("spec decode", f"{r.spec_tokens_per_s:.1f} tok/s ({r.proposer}, k={r.k}, window "
                        f"{r.window[0]}-{r.window[1]})"),
        ("spec / plain", f"{r.spec_speedup:.2f}x"),
        ("bench chain", f"seed {r.chain_seed}: {r.plain_steps} plain steps, {r.verify_passes} "
                        f"verify passes (ratio {r.pass_ratio:.2f}), {r.drafts_accepted}/"
                        f"{r.drafts_proposed} drafts accepted, ids identical: {r.identical}"),
    ]
    rows += [(f"c({n})", f"{c:.3f}  ({r.forward_ms[n]:.1f} ms)") for n, c in r.costs.items()]
    return kv_table("kolibri bench", rows)
