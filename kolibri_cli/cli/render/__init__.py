"""Rendering for the CLI: rich tables, progress bars and the streaming text printer.

Progress and statistics go to stderr; stdout carries only the generated text or the JSON.
"""

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from kolibri_cli.text import clean

err = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)


def note(text: str) -> None:
    """A one-line note on stderr (the `notify` callback lower layers get)."""
    err.print(cell(text), highlight=False, soft_wrap=True)


def cell(text) -> str:
    """A table cell from outside text: cleaned, and rich markup ([bold]) shown as typed."""
    return escape(clean(text))


class Bars:
    """Progress on stderr: one bar per stage, `(stage, done, total)` as `callbacks.Progress`;
    what is being compiled as one more line, in the user's words (`preparing`, a
    `callbacks.Preparing`: "the kernel that checks drafts (2 of 3)"), the functions numba
    compiled for it so far (`compiling`, a `callbacks.Compiling`), the time since the first and
    an estimate of the time left. Nothing is drawn before the first update (a compile that
    loads from the cache draws nothing), nor on a stderr that is no terminal (a log, a pipe)."""

    def __init__(self, description: str = ""):
        columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                   _Bytes(), TimeRemainingColumn(), TimeElapsedColumn())
        self.bar = Progress(*columns, console=err, transient=False, disable=not err.is_terminal)
        self.description, self.tasks, self.compiled = description, {}, 0
        self.part = ("compiled code", 0, 1)  # (words, parts done, parts in all)

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        key = f"{self.description}{stage}"
        self._task(key, total, bytes=stage in BYTE_STAGES)
        self.bar.update(self.tasks[key], completed=done, total=total)

    def preparing(self, what: str, done: int, total: int) -> None:
        """The next part to prepare; drawn at its first compile (or now, when a line is up)."""
        self.part = (what, done, total)
        if "compile" in self.tasks:
            self._draw()

    def compiling(self, what: str, finished: int, under_way: int) -> None:
        """numba's count of compiled functions (`what`, numba's own name, is not shown). The
        line's clock runs until the block ends: numba compiles a kernel as several top-level
        calls with none under way between them, so none of those pauses is its end."""
        self._task("compile", self.part[2])
        self.compiled = finished
        self._draw()

    def _draw(self) -> None:
        what, done, total = self.part
        count = f"{total} parts" if total > 1 else "1 part"
        text = (f"compiling {what} for this machine ({min(done + 1, total)} of {count}; "
                f"{self.compiled} functions so far)")
        self.bar.update(self.tasks["compile"], description=text, completed=done, total=total)

    def _task(self, key: str, total: int | None, **fields) -> int:
        if not self.tasks:
            self.bar.start()
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(key, total=total, **fields)
        return self.tasks[key]

    def stop(self) -> None:
        if "compile" in self.tasks:  # a full bar: the compiles are over
            total = self.part[2]
            self.bar.update(self.tasks["compile"], total=total, completed=total,
                            description=f"compiled {self.compiled} functions")
        if self.tasks:
            self.bar.stop()


BYTE_STAGES = {"download"}  # stages whose counts are bytes: drawn with their size and speed


class _Bytes(ProgressColumn):
    """A byte count's "12.3/92.9 MB 8.1 MB/s" (rich's own columns), for a task counting bytes;
    nothing for the others."""

    def __init__(self):
        super().__init__()
        self.size, self.speed = DownloadColumn(), TransferSpeedColumn()

    def render(self, task) -> Text:
        if not task.fields.get("bytes"):
            return Text("")
        return Text.assemble(self.size.render(task), " ", self.speed.render(task))


@contextmanager
def progress_bar(description: str = ""):
    """Yield a `Bars` (call it as (stage, done, total)); stopped when the block ends."""
    bars = Bars(description)
    try:
        yield bars
    finally:
        bars.stop()


class TextStreamer:
    """Prints decoded text as ids arrive (decode.stops.TextDeltas: an incomplete UTF-8 sequence
    and any tail that could begin a stop string are held back; a stop string is never printed)."""

    def __init__(self, tokenizer, stops=()):
        from kolibri_cli.decode.stops import TextDeltas

        self.deltas = TextDeltas(tokenizer, stops)

    def __call__(self, new_ids: list[int]) -> None:
        self._write(self.deltas.add(new_ids))

    def finish(self) -> None:
        self._write(self.deltas.finish())
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _write(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()


def kv_table(title: str, rows: list[tuple[str, object]]) -> Table:
    """Titles and values are shown as they are (never read as rich markup)."""
    table = Table(title=cell(title), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(cell(key), cell(value))
    return table


def info_table(i) -> Table:
    """`kolibri model info`: a ModelInfo in rows a person reads (the JSON keeps the fields)."""
    rows = [("architecture", f"{i.architecture}, {i.parameters:,} parameters"),
            ("path", i.path)]
    if source := _source_text(i.source):
        rows.append(("source", source))
    rows += [
        ("layers", f"{i.layers}, hidden size {i.hidden_size}"),
        ("attention", f"{i.heads} query heads, {i.kv_heads} KV heads (GQA {i.gqa_ratio}), "
                      f"head dim {i.head_dim}"),
        ("vocabulary", f"{i.vocab_size:,} tokens"),
        ("context", f"{i.context_length:,} tokens"),
        ("RoPE", f"{i.rope_type}, theta {i.rope_theta:g}"),
        ("features", _features_text(i)),
        ("storage", f"{storage_text(i.storage)} tensors (file dtypes: {', '.join(i.dtypes)})"),
        ("read per token", size(i.bytes_per_token)),
        ("chat template", "yes" if i.chat_template else "no (kolibri generate --raw only)"),
    ]
    return kv_table(i.name, rows)


def _source_text(meta: dict) -> str:
    """Where a cached model came from; "" for a user's folder."""
    if meta.get("source") == "import":
        return f"imported from {meta.get('gguf', '?')}"
    if meta.get("source"):
        return f"pulled from {meta['source']} ({Path(str(meta.get('gguf', ''))).name})"
    return ""


def _features_text(i) -> str:
    found = [name for name, on in (("q/k/v biases", i.qkv_bias), ("qk-norm", i.qk_norm),
                                   ("tied head", i.tied_head)) if on]
    if i.sliding_window:
        found.append(f"sliding window {i.sliding_window:,} on {i.sliding_layers} of "
                     f"{i.layers} layers")
    return ", ".join(found) or "none (plain Llama attention and MLP, untied head)"


def table(title: str, columns: list[str], rows: list[list[object]]) -> Table:
    t = Table(title=cell(title), title_justify="left")
    for c in columns:
        t.add_column(c, justify="right" if c not in (columns[0],) else "left")
    for r in rows:
        t.add_row(*(cell(x) for x in r))
    return t


def check_table(results) -> "FitTable":
    rows = []
    for r in results:
        if r.identical:
            rows.append([cell(r.id), str(r.tokens), "identical", "", "", ""])
        else:
            margin = "" if r.reference_margin is None else f"{r.reference_margin:.2e}"
            verdict = "near-tie" if r.explained else "DIVERGES"
            pair = f"{r.ours} vs {r.reference}"
            rows.append([cell(r.id), str(r.tokens), verdict, str(r.index), pair, margin])
    cols = [Col("id", numeric=False), Col("tokens", drop=2), Col("result", numeric=False),
            Col("index"), Col("ours vs ref", numeric=False), Col("ref margin", drop=1)]
    return FitTable("kolibri vs golden", cols, rows)


def verify_lines(v) -> list[Text]:
    """One line per file: status, name, size, and what differs (names in one column)."""
    names = [clean(f.file) for f in v.files] + [clean(rel) for rel in v.unrecorded]
    width = max(map(len, names), default=0)
    lines = []
    for f, name in zip(v.files, names, strict=False):
        what = {"ok": f"sha256 {f.sha256[:16]}",
                "damaged": f"sha256 {f.sha256[:16]}, recorded {f.expected_sha256[:16]}",
                "resized": f"{f.bytes} bytes, recorded {f.expected_bytes}",
                "missing": "not found"}[f.status]
        style = "green" if f.ok else "bold red"
        lines.append(Text.assemble((f"{f.status.upper():8}", style),
                                   f" {name:{width}}  {size(f.expected_bytes):>9}  {what}"))
    lines += [Text(f"{'EXTRA':8} {name:{width}}  not written by kolibri, not checked")
              for name in names[len(v.files):]]
    return lines


def size(n: int) -> str:
    """Bytes for a person: "1.32 GB", "112.4 MB", "20.5 kB", "512 B"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n} B"


def storage_text(storage: dict[str, int]) -> str:
    """{"Q4_1": 120, "Q8_0": 1} -> "Q4_1 x120, Q8_0 x1" (block type and tensors stored so)"""
    return ", ".join(f"{t} x{n}" for t, n in storage.items())


def bench_table(r) -> Table:
    """Plain decode against the bandwidth bound first, then c(n) (what the probe prices with),
    then the synthetic bench chain, labelled as the upper bound it is."""
    from kolibri_cli.decode.proposers import reads_cost_table

    rows = [
        ("plain decode",
         f"{r.plain_tokens_per_s:.1f} tok/s = {r.fraction_of_bound:.0%} of the bandwidth bound "
         f"({r.bound_tokens_per_s:.1f} tok/s)"),
        ("model", f"{r.model} ({r.threads} threads, medians of {r.repeats})"),
        ("read bandwidth", f"{r.bandwidth_gb_s:.1f} GB/s"),
        ("weights per token", f"{r.bytes_per_token / 1e6:.1f} MB ({storage_text(r.storage)})"),
    ]
    peer = r.peer.costs if r.peer is not None else {}
    rows += [(f"c({n})", f"{c:.3f}  ({r.forward_ms[n]:.1f} ms)"
              + (f"   llama.cpp --repack 0: {peer[n]:.3f}" if n in peer else ""))
             for n, c in r.costs.items()]
    if r.prefill_tokens:
        rows.append((f"prefill {r.prefill_tokens}", f"{r.prefill_tokens_per_s:.1f} tok/s"))
    rows += [
        ("synthetic chain", f"seed {r.chain_seed}: a random prompt whose greedy continuation "
                            "cycles, so nearly every draft is accepted — an upper bound on "
                            "speculation, not a forecast (`kolibri probe` answers for real "
                            "text)"),
        ("  spec decode", f"{r.spec_tokens_per_s:.1f} tok/s ({r.proposer}, k={r.k}, window "
                          f"{r.window[0]}-{r.window[1]})"),
        ("  spec / plain", f"{r.spec_speedup:.2f}x (upper bound) = {r.efficiency:.0%} of its "
                           f"pass ratio {r.pass_ratio:.2f}"),
        ("  passes", f"{r.plain_steps} plain steps, {r.verify_passes} verify passes (ratio "
                     f"{r.pass_ratio:.2f}), {r.drafts_accepted}/{r.drafts_proposed} drafts "
                     f"accepted, ids identical: {r.identical}"),
        ("  drafted by", r.pricing.line() if r.pricing else
         f"c(n) the {r.proposer} timed as it ran" if reads_cost_table(r.proposer) else "no c(n)"),
    ]
    rows.append(("choosing tokens", f"{_describe(r.sampling)}: {r.sample_us_per_token:.0f} us per "
                 f"token = {r.sample_fraction:.2%} of plain decode time"))
    rows.append(("peak memory", f"{r.peak_rss_bytes / 1e6:.0f} MB RSS"))
    if r.peer is not None:
        rows += _peer_rows(r)
    return kv_table("kolibri bench", rows)


def _peaks(r) -> str:
    ints = f", int16 {r.int_peak_gmacs:.0f} G" if r.numerics == "int16" else ""
    return (f"read bandwidth {r.bandwidth_gb_s:.1f} GB/s, multiply-add peak float32 "
            f"{r.peak_gmacs:.0f} G{ints}/s")


def profile_tables(r, tokens=None) -> list[Table]:
    """One table per profiled forward (bench.profile.ProfileResult) of `tokens` (None: each):
    each piece's time, what it reads and computes, and how close it runs to the bandwidth bound
    or the path's multiply-add peak."""
    bw, peak = r.bandwidth_gb_s * 1e9, r.bound_gmacs * 1e9
    tables = []
    for f in r.forwards:
        if tokens is not None and f.tokens not in tokens:
            continue
        rows = []
        for p in f.pieces:
            bound_ms = 1e3 * max(p.bytes / bw, p.macs / peak)
            rows.append([p.kind, f"{p.ms:.3f}", f"{p.ms / f.ms:.0%}",
                         f"{p.bytes / p.ms / 1e6:.1f}" if p.bytes else "",
                         f"{p.macs / p.ms / 1e6:.1f}" if p.macs else "",
                         f"{bound_ms / p.ms:.0%}" if bound_ms else ""])
        title = (f"forward of {f.tokens} token{'s' if f.tokens > 1 else ''}: {f.ms:.2f} ms, "
                 f"{f.regions} parallel regions ({r.model}, {r.numerics}, {r.threads} threads, "
                 f"{r.cpu}; {_peaks(r)}; medians of {r.repeats})")
        tables.append(table(title, ["piece", "ms", "share", "GB/s", "G MAC/s", "of bound"],
                            rows))
    return tables


def cost_profile_table(r, rows: list[dict]) -> Table:
    """The c(T) curve (bench.profile.cost_rows): each T-token forward's ms by piece, and its
    matmuls' rate against the bound"""
    kinds = ("qkv", "o", "gate_up", "down", "head", "attention", "between regions", "other")
    title = (f"c(T): a T-token forward at 100 cached positions, ms ({r.model}, {r.numerics}, "
             f"{r.threads} threads, {r.cpu}; {_peaks(r)}; medians of {r.repeats})")
    return table(title, ["T", "ms", "c(T)", *kinds, "matmuls G MAC/s", "GB/s", "of bound"],
                 [[w["tokens"], f"{w['ms']:.2f}", f"{w['cost']:.2f}",
                   *(f"{w[k]:.2f}" for k in kinds), f"{w['matmul_gmacs']:.1f}",
                   f"{w['matmul_gb_s']:.1f}", f"{w['of_bound']:.0%}"] for w in rows])


def fidelity_table(r) -> Table:
    """bench.fidelity.Fidelity: the goldens a numeric path reproduces, its worst logit"""
    return kv_table(f"kolibri bench --fidelity ({r.numerics})", [
        (f"{'shipped' if r.source == 'shipped' else 'their'} greedy goldens reproduced",
         f"{r.reproduced}/{r.goldens}"),
        ("goldens", f"{r.source} (recorded by {', '.join(r.references)})"),
        ("largest |logit - float32 path's|", f"{r.max_logit_diff:.3g}"
         + (f" (golden {r.at})" if r.at else "")),
        ("within the law", f"{'yes' if r.within_law else 'NO'} (largest |logit diff| <= "
                           f"{r.bound:g})"),
        *([("diverged", f"{r.at_near_tie} at a near-tie (reference top-2 margin < {r.tie:.3g} = "
                        f"max(1e-3, twice the largest diff)), {r.failures} above it"
                        + (f", {r.unrecorded} with no margin recorded" if r.unrecorded else ""))]
          if r.divergences else []),
        *((f"golden {d.golden}", _divergence(d)) for d in r.divergences)])


def _divergence(d) -> str:
    """bench.fidelity.Divergence: where a chain left the reference, at what margin"""
    margin = "not recorded" if d.margin is None else f"{d.margin:.3g}"
    kind = ("at a near-tie" if d.near_tie else "not classified" if d.margin is None
            else "a fidelity failure")
    return (f"step {d.step}: {d.ours} for {d.reference}, reference top-2 margin {margin} "
            f"({kind})")


def _describe(sampling: dict) -> str:
    from kolibri_cli.decode.sampling import Sampling

    return Sampling.from_dict(sampling).describe()


def server_costs_table(r) -> Table:
    """c(n) of an inference server (bench.engine_costs.ServerCosts)."""
    threads = f"{r.threads} threads, " if r.threads else ""
    rows = [("engine", f"{r.engine} ({threads}medians of {r.repeats})"),
            ("method", r.method),
            ("prompt", f"{r.prompt_tokens} tokens (a repeated random sequence)"
                       + (f", {r.new_tokens} new tokens per request" if r.new_tokens else ""))]
    ms = r.forward_ms
    for p in sorted(r.passes, key=lambda p: p.n):
        full = f", {min(p.full):.0%}-{max(p.full):.0%} of passes full" \
            if p.n > 1 and r.new_tokens else ""  # prompt evaluation: every batch is full
        rows.append((f"c({p.n})", f"{r.costs[p.n]:.3f}  ({ms[p.n]:.1f} ms per pass, "
                                  f"{min(p.ms):.1f}-{max(p.ms):.1f}{full})"))
    rows.append(("least-squares line", f"c(n) = 1 + {r.slope:.3f} (n - 1): "
                 + ", ".join(f"{c:.2f}" for c in r.fitted.values())))
    rows.append(("for kolibri probe", f"--costs {r.costs_option}" if r.costs_option else
                 "--costs FILE, FILE the curve as --json gives it: `--json | jq .costs > FILE`"))
    return kv_table(f"kolibri bench (server, {r.method})", rows)


def _peer_rows(r) -> list[tuple[str, str]]:
    p = r.peer
    rows = [("peer", f"{p.engine} {p.version} on {p.gguf}, {p.threads} threads, "
                     f"{p.repetitions} repetitions")]
    rows += [(f"peer decode, {v}", f"{tps:.1f} tok/s") for v, tps in p.decode_tokens_per_s.items()]
    rows += [(f"peer prefill {r.prefill_tokens}, {v}", f"{tps:.1f} tok/s")
             for v, tps in p.prefill_tokens_per_s.items()]
    rows += [(f"peer {what}", f"failed: {why}") for what, why in p.failures.items()]
    rows += [(f"kolibri / peer, {what}", f"{x:.2f}x") for what, x in r.peer_ratios().items()]
    return rows + (_rounds_rows(r.rounds) if r.rounds else [])


def _rounds_rows(d) -> list[tuple[str, str]]:
    """Decode against llama.cpp in alternating rounds: ratios with their spread, each engine's
    tok/s and fraction of the bandwidth bound at the bytes it reads per token."""
    s, n = d.summary(), len(d.kolibri)
    rows = [(f"decode, {n} rounds", f"kolibri {_spread(s['kolibri'])} tok/s = "
             f"{s['kolibri']['fraction_of_bound']:.0%} of its bound "
             f"({d.kolibri_bytes_per_token / 1e6:.1f} MB a token)")]
    for v in d.peer:
        rows.append((f"decode, llama.cpp {v}", f"{_spread(s[v])} tok/s = "
                     f"{s[v]['fraction_of_bound']:.0%} of its bound "
                     f"({d.peer_bytes_per_token / 1e6:.1f} MB a token); kolibri / llama.cpp "
                     f"{_spread(s[v]['ratio'], 2)}x"))
    return rows


def _spread(x: dict, digits: int = 1) -> str:
    """"median (min-max)" of a summary's figure"""
    return f"{x['median']:.{digits}f} ({x['min']:.{digits}f}-{x['max']:.{digits}f})"


@dataclass
class Col:
    """A column of a FitTable. Numbers are never cut: a numeric column is at least as wide as
    its widest cell; text columns fold. When even that does not fit the terminal, columns with a
    drop rank go, highest rank first (0 = always kept)."""

    header: str
    numeric: bool = True
    drop: int = 0
    footer: str = ""
    style: str | None = None


class FitTable:
    """A rich table that fits the width it is rendered at without truncating a number."""

    def __init__(self, title: str, cols: list[Col], rows: list[list], caption: str | None = None,
                 row_styles: list[str | None] | None = None, **table_options):
        self.title, self.cols, self.rows, self.caption = title, cols, rows, caption
        self.row_styles = row_styles or [None] * len(rows)
        self.options = table_options

    def __rich_console__(self, console, options):
        keep = list(range(len(self.cols)))
        droppable = sorted((i for i, c in enumerate(self.cols) if c.drop), key=lambda i:
                           -self.cols[i].drop)
        while self._min_width(keep) > options.max_width and droppable:
            keep.remove(droppable.pop(0))
        yield self._table(keep)

    def _width(self, i: int) -> int:
        """The narrowest this column may be: a numeric column never wraps (its widest cell or
        its header); text folds, down to 8 cells or its header's longest word."""
        col = self.cols[i]
        widest = max([_cell_len(r[i]) for r in self.rows] + [_cell_len(col.footer)])
        if col.numeric:
            return max(widest, len(col.header))
        return max(min(widest, 8), *(len(w) for w in col.header.split() or [""]))

    def _min_width(self, keep: list[int]) -> int:
        return 1 + sum(self._width(i) + 3 for i in keep)  # borders + padding of 1 each side

    def _table(self, keep: list[int]) -> Table:
        show_footer = any(self.cols[i].footer for i in keep)
        t = Table(title=self.title, caption=self.caption, show_footer=show_footer,
                  **self.options)
        for i in keep:
            c = self.cols[i]
            if c.numeric:
                t.add_column(c.header, footer=c.footer, justify="right", no_wrap=True,
                             min_width=self._width(i), overflow="fold", style=c.style)
            else:
                t.add_column(c.header, footer=c.footer, overflow="fold", style=c.style)
        for row, style in zip(self.rows, self.row_styles, strict=True):
            t.add_row(*(row[i] for i in keep), style=style)
        return t


def _cell_len(cell) -> int:
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return max((Text(line).cell_len for line in text.plain.splitlines()), default=0)
