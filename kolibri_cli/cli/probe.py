"""`kolibri probe`: would n-gram speculation make this faster, by how much, with which settings?

Each option is declared here, once, as a typer parameter; its name is the ProbeConfig field (and
the PROBE.toml key) it sets (probe/config.py merges the two, the command line winning). Calls
probe/run.py, renders its ProbeResult (terminal, JSON, Markdown, PNG) and exits on its gates.
Heavy modules are imported inside the command so `kolibri --help` stays fast.
"""

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.cli.options import (
    DYNAMIC_CACHE_HELP,
    GGUF_HELP,
    MIN_HITS_HELP,
    N_MIN_HELP,
    STATIC_CACHE_HELP,
)
from kolibri_cli.costs.model import GUESSED_COSTS
from kolibri_cli.decode.proposers import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_WINDOW,
    GUARD_K,
    PROPOSERS,
    format_window,
)
from kolibri_cli.decode.sampling import OPTION_HELP as SAMPLING_HELP
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.where import GRAMMAR as WHERE
from kolibri_cli.probe.where import help_text as where_columns

SIMULATE, PRICE, MEASURE, REPORT, SCALE = ("What to simulate", "Pricing: c(n)",
                                           "Measuring with the model", "Reports and gates",
                                           "Scale")


def guess_text() -> str:
    """"c(2) = 1.08, ..., c(64) = 35.18, linear between, ...": the guess as the help gives it."""
    values = ", ".join(f"c({n}) = {c:g}" for n, c in GUESSED_COSTS.items() if n > 1)
    return f"{values}, linear between, then the last slope"


# Lists and several values arrive as text ("1,2,3"), parsed with PROBE.toml's values in
# probe/config.py; None = not given (PROBE.toml's value, else the default). Repeatable options
# take str: typer reads "" as "." for a Path.
ConfigArg = Annotated[Path | None, typer.Argument(
    metavar="PROBE.toml", help="PROBE.toml with saved options (paths in it are relative to it).")]
GoldensOpt = Annotated[list[str] | None, typer.Option(
    "--goldens", "-g", metavar="PATH", rich_help_panel=SIMULATE,
    help="Golden JSONL file or folder (repeatable). [default: the shipped goldens]")]
KOpt = Annotated[str | None, typer.Option(
    "--k", metavar="K[,K...]", rich_help_panel=SIMULATE,
    help="Draft tokens per pass (tree proposers: tree nodes), or a sweep: 1,2,3,5,8. "
    f"[default: {DEFAULT_K}; guard: {GUARD_K}; llama.cpp's types and tree proposers: their "
    "own]")]
WindowOpt = Annotated[str | None, typer.Option(
    "--window", metavar="MIN-MAX[,...]", rich_help_panel=SIMULATE,
    help="n-gram lengths MIN-MAX or N (llama.cpp's types: n = MAX), or a sweep: 1-4,2-4,3-5. "
    f"[default: {format_window(DEFAULT_WINDOW)}, or the proposer's own]")]
ProposerOpt = Annotated[str | None, typer.Option(
    "--proposer", metavar="NAME[,...]", rich_help_panel=SIMULATE,
    help=f"Draft proposer(s): {', '.join(PROPOSERS)} (ngram = vllm); several = a comparison "
    f"table. [default: {DEFAULT_PROPOSER}: a fixed rule vLLM, SGLang and llama.cpp run "
    "too, so the answer is a setting to deploy; `generate --spec` drafts with guard, "
    "kolibri's cost-aware rule (docs/probe.md)]")]
CrossRequestOpt = Annotated[bool | None, typer.Option(
    "--cross-request/--no-cross-request", rich_help_panel=SIMULATE,
    help="suffix: also draft from a global tree over earlier goldens' outputs.")]
MinHitsOpt = Annotated[int | None, typer.Option(
    "--min-hits", metavar="N", rich_help_panel=SIMULATE,
    help=MIN_HITS_HELP)]
NMinOpt = Annotated[int | None, typer.Option(
    "--n-min", metavar="N", rich_help_panel=SIMULATE,
    help=N_MIN_HELP)]
LookupCacheStaticOpt = Annotated[Path | None, typer.Option(
    "--lookup-cache-static", metavar="FILE", rich_help_panel=SIMULATE,
    help=STATIC_CACHE_HELP)]
LookupCacheDynamicOpt = Annotated[Path | None, typer.Option(
    "--lookup-cache-dynamic", metavar="FILE", rich_help_panel=SIMULATE,
    help=DYNAMIC_CACHE_HELP)]
CategoryOpt = Annotated[str | None, typer.Option(
    "--category", metavar="NAME[,...]", rich_help_panel=SIMULATE,
    help="Only goldens of these categories (comma-separated).")]
WhereOpt = Annotated[str | None, typer.Option(
    "--where", metavar="EXPR", rich_help_panel=SIMULATE,
    help="Only the goldens whose columns meet EXPR, evaluated by numexpr over them as arrays "
    "(at any scale, --workers and --ray too); the verdict names the slice, e.g. "
    f"'{WHERE.example}'. Columns: {where_columns()}. Operators: comparisons, + - * /, & | ~ "
    "(and, or, not), parentheses (docs/probe.md).")]
LimitOpt = Annotated[int | None, typer.Option(
    "--limit", metavar="N", rich_help_panel=SIMULATE,
    help="At most N goldens.")]
MaxTokensOpt = Annotated[int | None, typer.Option(
    "--max-tokens", metavar="N", rich_help_panel=SIMULATE,
    help="Use only the first N output ids of each golden.")]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    "--concurrency", metavar="B[,B...]", rich_help_panel=SIMULATE,
    help="Also simulate a server under steady load, B sequences at once (e.g. "
    "1,2,4,8,16,32,64): throughput speedup per B, the best setting per B, and the "
    "concurrency above which drafting stops paying (docs/load.md).")]
CostsOpt = Annotated[str | None, typer.Option(
    "--costs", metavar="C1,C2,...|measure|default", rich_help_panel=PRICE,
    help="Forward costs c(1),c(2),... every predicted speedup is priced with (and adaptive, "
    "adaptive-tree and the guard draft by); measure = time them now on the goldens' model "
    "(tens of seconds) and keep them, as `kolibri bench` does; default = the guess below, "
    "ignoring stored benches. [default: the c(n) `kolibri bench` stored for the goldens' "
    f"model (and --threads), else a guess: {guess_text()}]")]
ByCategoryOpt = Annotated[bool | None, typer.Option(
    "--by-category/--no-by-category", rich_help_panel=REPORT,
    help="Also show the verdict and counts per category.")]
JsonOpt = Annotated[bool | None, typer.Option(
    "--json/--no-json", rich_help_panel=REPORT,
    help="Print one JSON object on stdout instead of tables.")]
MarkdownOpt = Annotated[Path | None, typer.Option(
    "--markdown", metavar="FILE", rich_help_panel=REPORT,
    help="Write a Markdown report to FILE.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", metavar="FILE.png", rich_help_panel=REPORT,
    help="Write a PNG (predicted speedup over k with the 1.0x line, per-position "
    "acceptance); needs matplotlib.")]
RowsOpt = Annotated[Path | None, typer.Option(
    "--rows", metavar="FILE", rich_help_panel=REPORT,
    help="Write every chain's counts to FILE (JSONL, one line per chain and "
    "configuration).")]
GateOpt = Annotated[list[str] | None, typer.Option(
    "--gate", metavar="EXPR", rich_help_panel=REPORT,
    help="Gate (repeatable): exit 1 unless EXPR holds for the fastest setting, e.g. "
    "'speedup >= 1.15 & worst >= 0.97'. Names: speedup, predicted, measured, low, "
    "high (its 95% interval), worst, faster (share of goldens), ratio, acceptance, "
    "mean_len, goldens, crossover; with --measure expected (this host's c(n) predict), "
    "spec_equals_plain, counts_match_simulation (1 or 0) (docs/probe.md).")]
MinSpeedupOpt = Annotated[float | None, typer.Option(
    "--min-speedup", metavar="Z", rich_help_panel=REPORT,
    help="Gate: exit 1 if the fastest setting's speedup (measured with --measure, else "
    "predicted) is below this; = --gate 'speedup >= Z'.")]
MinRatioOpt = Annotated[float | None, typer.Option(
    "--min-ratio", metavar="X", rich_help_panel=REPORT,
    help="Gate: exit 1 if the fastest setting's ratio is below this.")]
MinAcceptanceOpt = Annotated[float | None, typer.Option(
    "--min-acceptance", metavar="Y", rich_help_panel=REPORT,
    help="Gate: exit 1 if the fastest setting's acceptance rate is below this (0-1).")]
MeasureOpt = Annotated[bool | None, typer.Option(
    "--measure/--no-measure", rich_help_panel=MEASURE,
    help="Also run the model, plain and spec, on every golden (for the fastest setting, of"
    " each proposer when comparing): tok/s, measured vs predicted speedup, spec == "
    "plain, and the guard report (spec / plain per golden, the worst).")]
BenchOpt = Annotated[bool | None, typer.Option(
    "--bench/--no-bench", rich_help_panel=MEASURE,
    help="Add the bench chain (a seeded random prompt whose greedy continuation cycles; "
    "runs the model once for its chain).")]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", metavar="NAME|PATH", rich_help_panel=MEASURE,
    help="Model for --measure, --bench or --costs measure. For a server engine only its "
    "tokenizer is read (a folder of tokenizer files, or a GGUF's metadata). [default: with "
    "--engine URL the server's own tokenizer, else smollm2-135m-instruct]")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", "-t", metavar="N", rich_help_panel=MEASURE,
    help="Kernel (or started llama-servers') threads for --measure and --costs measure.")]
RepeatsOpt = Annotated[int | None, typer.Option(
    "--repeats", metavar="N", rich_help_panel=MEASURE,
    help="--measure: runs per golden, plain and spec taking turns; medians. In kolibri: "
    "rounds over every golden, each running every measured configuration; N for the "
    "longest golden, more for shorter ones (up to 4N) [default: 1 in kolibri, 3 on a "
    "server]")]
EngineOpt = Annotated[str | None, typer.Option(
    "--engine", metavar="ENGINE", rich_help_panel=MEASURE,
    help="Where --measure runs: kolibri; llama-server (started on the model's GGUF, with "
    "c(n) timed in its own loop); or the base URL of a speculating server (with "
    "--baseline). [default: kolibri]")]
BaselineOpt = Annotated[str | None, typer.Option(
    "--baseline", metavar="URL", rich_help_panel=MEASURE,
    help="Base URL of the plain twin of the server at --engine URL (same model, no "
    "speculation).")]
EngineApiOpt = Annotated[str | None, typer.Option(
    "--engine-api", metavar="API", rich_help_panel=MEASURE,
    help="API of the servers at URLs: llama.cpp, vllm or openai. [default: detected]")]
GgufOpt = Annotated[Path | None, typer.Option(
    "--gguf", metavar="FILE", rich_help_panel=MEASURE,
    help=GGUF_HELP)]
TimeoutOpt = Annotated[float | None, typer.Option(
    "--timeout", metavar="S", rich_help_panel=MEASURE,
    help="Seconds to wait for one server answer. [default: 600]")]
AllowModelMismatchOpt = Annotated[bool | None, typer.Option(
    "--allow-model-mismatch/--no-allow-model-mismatch", rich_help_panel=MEASURE,
    help="Measure goldens recorded for another model.")]
TemperatureOpt = Annotated[float | None, typer.Option(
    "--temperature", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["temperature"])]
TopKOpt = Annotated[int | None, typer.Option(
    "--top-k", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["top_k"])]
TopPOpt = Annotated[float | None, typer.Option(
    "--top-p", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["top_p"])]
MinPOpt = Annotated[float | None, typer.Option(
    "--min-p", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["min_p"])]
RepetitionPenaltyOpt = Annotated[float | None, typer.Option(
    "--repetition-penalty", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["repetition_penalty"])]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", rich_help_panel=MEASURE,
    help=SAMPLING_HELP["seed"])]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", "-w", metavar="N", rich_help_panel=SCALE,
    help="Simulate in N local processes. [default: the cores; 1 for a small input]")]
RayOpt = Annotated[bool | None, typer.Option(
    "--ray/--no-ray", rich_help_panel=SCALE,
    help="Simulate on Ray: a new local Ray instance, or the cluster at --ray-address; "
    "needs kolibri-cli[ray].")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--ray-address", metavar="ADDRESS", rich_help_panel=SCALE,
    help="The Ray cluster for --ray (implies it): auto = the one this machine is in, "
    "ray://HOST:10001, HOST:6379.")]


def probe(config: ConfigArg = None,
          goldens: GoldensOpt = None,
          k: KOpt = None,
          window: WindowOpt = None,
          proposer: ProposerOpt = None,
          cross_request: CrossRequestOpt = None,
          min_hits: MinHitsOpt = None,
          n_min: NMinOpt = None,
          lookup_cache_static: LookupCacheStaticOpt = None,
          lookup_cache_dynamic: LookupCacheDynamicOpt = None,
          category: CategoryOpt = None,
          where: WhereOpt = None,
          limit: LimitOpt = None,
          max_tokens: MaxTokensOpt = None,
          concurrency: ConcurrencyOpt = None,
          costs: CostsOpt = None,
          by_category: ByCategoryOpt = None,
          json: JsonOpt = None,
          markdown: MarkdownOpt = None,
          plot: PlotOpt = None,
          rows: RowsOpt = None,
          gate: GateOpt = None,
          min_speedup: MinSpeedupOpt = None,
          min_ratio: MinRatioOpt = None,
          min_acceptance: MinAcceptanceOpt = None,
          measure: MeasureOpt = None,
          bench: BenchOpt = None,
          model: ModelOpt = None,
          threads: ThreadsOpt = None,
          repeats: RepeatsOpt = None,
          engine: EngineOpt = None,
          baseline: BaselineOpt = None,
          engine_api: EngineApiOpt = None,
          gguf: GgufOpt = None,
          timeout: TimeoutOpt = None,
          allow_model_mismatch: AllowModelMismatchOpt = None,
          temperature: TemperatureOpt = None,
          top_k: TopKOpt = None,
          top_p: TopPOpt = None,
          min_p: MinPOpt = None,
          repetition_penalty: RepetitionPenaltyOpt = None,
          seed: SeedOpt = None,
          workers: WorkersOpt = None,
          ray: RayOpt = None,
          ray_address: RayAddressOpt = None,
          ) -> None:
    """Would n-gram speculation make this faster? Simulates it over golden chains (exact
    counts, no model needed) and answers in speed: the fastest setting, how much faster than
    plain decoding, how sure, and whether to turn it on. With --measure, each golden is also run
    as it was recorded (greedy or sampled) unless sampling options override that for all."""
    given = dict(locals())  # each option by the name of the ProbeConfig field it sets
    from kolibri_cli.probe.config import load_config

    run_probe(load_config(given.pop("config"), given))


def run_probe(cfg) -> None:
    """Run the probe (probe/run.py decides everything), write the files asked for, print the
    verdict first, then fail on the gates."""
    from kolibri_cli.cli.options import print_json
    from kolibri_cli.cli.render import note
    from kolibri_cli.cli.render.probe import render_probe, require_matplotlib, write_plot
    from kolibri_cli.probe import run
    from kolibri_cli.probe.config import command_line
    from kolibri_cli.probe.report import build_report, render_markdown
    from kolibri_cli.store.atomic import write_text_atomic

    if cfg.plot:
        require_matplotlib()
    result = run.run(cfg, _ui())
    if cfg.plot:
        write_plot(cfg.plot, result)
    if cfg.markdown:
        write_text_atomic(cfg.markdown, render_markdown(result, command_line(cfg),
                                                        plot=run.plot_link(cfg)))
        note(f"wrote {cfg.markdown}")
    if cfg.json:
        print_json(build_report(result), indent=None)
    else:
        render_probe(result)
    if cfg.pricing.note:
        note(cfg.pricing.note)
    if result.failures:
        more = f" (and {len(result.failures) - 3} more)" if len(result.failures) > 3 else ""
        raise KolibriError("gate failed: " + "; ".join(result.failures[:3]) + more)


def _ui():
    """The terminal the probe's workflow reports to: bars and notes on stderr."""
    from kolibri_cli.cli import options, render
    from kolibri_cli.cli.render.probe import throughput_bar
    from kolibri_cli.probe.run import Ui

    @contextmanager
    def progress(label: str):
        with render.progress_bar(label) as bar:
            yield lambda done, total: bar("", done, total)

    return Ui(load_model=lambda spec, threads, weights: options.load_model(spec, threads,
                                                                           weights=weights),
              load_tokenizer=options.load_tokenizer,
              sampling=lambda model, given: options.resolve_sampling(
                  model, options.sampling_options(**given)),
              progress=progress, simulating=throughput_bar, note=render.note)
