"""`kolibri probe`: would n-gram speculation pay off on these goldens, with which proposer, k and
window?

Parses options (on top of an optional PROBE.toml), simulates, renders, gates. Heavy modules
(numba, the simulation, rich rendering) are imported inside the command so `kolibri --help`
stays fast.
"""

import os
import shlex
from contextlib import contextmanager
from pathlib import Path

import typer

from kolibri_cli.cli.options import (
    MinPOpt,
    RepetitionPenaltyOpt,
    SeedOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
)
from kolibri_cli.decode.costs import GUESSED_COSTS
from kolibri_cli.decode.proposers import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_WINDOW,
    GUARD_K,
    PROPOSERS,
    format_window,
)
from kolibri_cli.errors import KolibriError


def _guess_text() -> str:
    c = GUESSED_COSTS
    return f"c(2) = {c[2]:g}, then +{c[3] - c[2]:.2g} per row"


def probe(
    config: Path | None = typer.Argument(
        None,
        metavar="PROBE.toml",
        help="PROBE.toml with saved options (paths in it are relative to it).",
    ),
    goldens: list[str] | None = typer.Option(  # str: typer would read "" as "."
        None,
        "--goldens",
        "-g",
        metavar="PATH",
        help="Golden JSONL file or folder (repeatable). [default: the shipped goldens]",
    ),
    k: str | None = typer.Option(
        None,
        "--k",
        metavar="K[,K...]",
        help=f"Draft tokens per pass (tree proposers: tree nodes), or a sweep: 1,2,3,5,8. "
        f"[default: {DEFAULT_K}; guard: {GUARD_K}; llama.cpp's types and tree proposers: their "
        "own]",
    ),
    window: str | None = typer.Option(
        None,
        "--window",
        metavar="MIN-MAX[,...]",
        help="n-gram lengths MIN-MAX or N (llama.cpp's types: n = MAX), or a sweep: "
        f"1-4,2-4,3-5. [default: {format_window(DEFAULT_WINDOW)}, or the proposer's own]",
    ),
    proposer: str | None = typer.Option(
        None,
        "--proposer",
        metavar="NAME[,...]",
        help=f"Draft proposer(s): {', '.join(PROPOSERS)} (ngram = vllm); several = a "
        f"comparison table. [default: {DEFAULT_PROPOSER}]",
    ),
    cross_request: bool | None = typer.Option(
        None,
        "--cross-request/--no-cross-request",
        help="suffix: also draft from a global tree over earlier goldens' outputs.",
    ),
    min_hits: int | None = typer.Option(
        None, "--min-hits", metavar="N", help="llamacpp-map-k4v: key hits before it drafts. "
        "[default: 1]"
    ),
    n_min: int | None = typer.Option(
        None, "--n-min", metavar="N", help="llamacpp-mod: fewest chained tokens that make a "
        "draft. [default: 48]"
    ),
    lookup_cache_static: Path | None = typer.Option(
        None, "--lookup-cache-static", metavar="FILE", help="llamacpp-cache: a llama.cpp "
        "static n-gram cache file (llama-lookup-create)."
    ),
    lookup_cache_dynamic: Path | None = typer.Option(
        None, "--lookup-cache-dynamic", metavar="FILE", help="llamacpp-cache: a llama.cpp "
        "dynamic n-gram cache file."
    ),
    costs: str | None = typer.Option(
        None,
        "--costs",
        metavar="C1,C2,...|measure|default",
        help="Forward costs c(1),c(2),... every predicted speedup is priced with (and adaptive, "
        "adaptive-tree and the guard draft by); measure = time them now on the goldens' model "
        "(tens of seconds) and keep them, as `kolibri bench` does; default = the guess below, "
        "ignoring stored benches. "
        "[default: the c(n) `kolibri bench` stored for the goldens' model (and --threads), else "
        "a guess: "
        f"{_guess_text()}]",
    ),
    category: str | None = typer.Option(
        None,
        "--category",
        metavar="NAME[,...]",
        help="Only goldens of these categories (comma-separated).",
    ),
    limit: int | None = typer.Option(None, "--limit", metavar="N", help="At most N goldens."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", metavar="N", help="Use only the first N output ids of each golden."
    ),
    by_category: bool | None = typer.Option(
        None, "--by-category/--no-by-category", help="Also show counts per category."
    ),
    min_ratio: float | None = typer.Option(
        None, "--min-ratio", metavar="X", help="Gate: exit 1 if a run's ratio is below this."
    ),
    min_acceptance: float | None = typer.Option(
        None,
        "--min-acceptance",
        metavar="Y",
        help="Gate: exit 1 if the fastest setting's acceptance rate is below this (0-1).",
    ),
    min_speedup: float | None = typer.Option(
        None,
        "--min-speedup",
        metavar="Z",
        help="Gate: exit 1 if the fastest setting's speedup (measured with --measure, else "
        "predicted) is below this; = --gate 'speedup >= Z'.",
    ),
    gate: list[str] | None = typer.Option(
        None,
        "--gate",
        metavar="EXPR",
        help="Gate (repeatable): exit 1 unless EXPR holds for the fastest setting, e.g. "
        "'speedup >= 1.15 & worst >= 0.97'. Names: speedup, predicted, measured, low, high "
        "(its 95% interval), worst, faster (share of goldens), ratio, acceptance, mean_len, "
        "goldens (docs/probe.md).",
    ),
    markdown: Path | None = typer.Option(
        None, "--markdown", metavar="FILE", help="Write a Markdown report to FILE."
    ),
    json_out: bool | None = typer.Option(
        None, "--json/--no-json", help="Print one JSON object on stdout instead of tables."
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Write a PNG (sweep + per-position acceptance); needs matplotlib.",
    ),
    measure: bool | None = typer.Option(
        None,
        "--measure/--no-measure",
        help="Also run the model, plain and spec, on every golden (for the best configuration "
        "of a sweep, of each proposer when comparing): tok/s, measured vs predicted speedup, "
        "spec == plain, and the guard report (spec / plain per golden, the worst).",
    ),
    bench: bool | None = typer.Option(
        None,
        "--bench/--no-bench",
        help="Add the bench chain (a seeded random prompt whose greedy continuation cycles; "
        "runs the model once for its chain).",
    ),
    engine: str | None = typer.Option(
        None, "--engine", metavar="ENGINE", help="Where --measure runs: kolibri; llama-server "
        "(started on the model's GGUF, with c(n) timed in its own loop); or the base URL of a "
        "speculating server (with --baseline). [default: kolibri]"
    ),
    baseline: str | None = typer.Option(
        None, "--baseline", metavar="URL", help="Base URL of the plain twin of the server at "
        "--engine URL (same model, no speculation)."
    ),
    engine_api: str | None = typer.Option(
        None, "--engine-api", metavar="API", help="API of the servers at URLs: llama.cpp, vllm "
        "or openai. [default: detected]"
    ),
    gguf: Path | None = typer.Option(
        None, "--gguf", metavar="FILE", help="GGUF for --engine llama-server. [default: the "
        "model's own]"
    ),
    repeats: int | None = typer.Option(
        None, "--repeats", metavar="N", help="--measure: runs per golden, plain and spec taking "
        "turns; medians. In kolibri: rounds over every golden, each running every measured "
        "configuration; N for the longest golden, more for shorter ones (up to 4N) "
        "[default: 1 in kolibri, 3 on a server]"
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", metavar="S", help="Seconds to wait for one server answer. "
        "[default: 600]"
    ),
    model: str | None = typer.Option(
        None, "--model", "-m", metavar="NAME|PATH", help="Model for --measure or --bench (its "
        "tokenizer only, for a server engine). [default: smollm2-135m-instruct]"
    ),
    threads: int | None = typer.Option(
        None, "--threads", "-t", metavar="N", help="Kernel (or started llama-servers') threads "
        "for --measure."
    ),
    allow_model_mismatch: bool | None = typer.Option(
        None,
        "--allow-model-mismatch/--no-allow-model-mismatch",
        help="Measure goldens recorded for another model.",
    ),
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    repetition_penalty: RepetitionPenaltyOpt = None,
    seed: SeedOpt = None,
    workers: int | None = typer.Option(
        None, "--workers", "-w", metavar="N",
        help="Simulate in N local processes. [default: the cores; 1 for a small input]",
    ),
    ray: bool | None = typer.Option(
        None, "--ray/--no-ray",
        help="Simulate on Ray: a new local Ray instance, or the cluster at --ray-address; "
        "needs kolibri[ray].",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", metavar="ADDRESS",
        help="The Ray cluster for --ray (implies it): auto = the one this machine is in, "
        "ray://HOST:10001, HOST:6379.",
    ),
    rows: Path | None = typer.Option(
        None, "--rows", metavar="FILE",
        help="Write every chain's counts to FILE (JSONL, one line per chain and configuration).",
    ),
) -> None:
    """Simulate n-gram speculation over golden chains: exact counts, no model needed. With
    --measure, each golden is run as it was recorded (greedy or sampled) unless sampling options
    override that for all."""
    overrides = dict(locals())  # option name -> value; None = not given (PROBE.toml decides)
    overrides.pop("config")
    overrides["json"] = overrides.pop("json_out")
    address = overrides.pop("ray_address")
    overrides["ray"] = address or overrides["ray"]
    from kolibri_cli.probe.config import load_config

    run_probe(load_config(config, overrides))


def run_probe(cfg) -> None:
    """Simulate (and measure), write the requested files, print the verdict first, then apply
    the gates."""
    from kolibri_cli.cli.options import print_json
    from kolibri_cli.cli.render import note
    from kolibri_cli.cli.render_probe import render_probe, require_matplotlib, write_plot
    from kolibri_cli.probe.report import build_report, render_markdown
    from kolibri_cli.probe.result import build_result

    _refuse_unavailable(cfg)
    if cfg.plot:
        require_matplotlib()
    _check_outputs(cfg)
    cfg.pricing = _pricing(cfg)
    model = (_load_model(cfg, weights=cfg.bench or _in_process(cfg))
             if cfg.measure or cfg.bench else None)
    extra = [_bench_golden(model)] if cfg.bench else []
    if cfg.measure:
        goldens = _goldens_in_memory(cfg) + extra
        runs, throughput = _simulate(cfg, _in_memory_tasks(cfg, goldens))
        measured = _measure(cfg, model, goldens, runs)
    else:
        runs, throughput = _simulate(cfg, _planned_tasks(cfg, extra))
        measured = None
    result = build_result(cfg, runs, cfg.pricing, measured, throughput)
    if cfg.pricing.note:
        note(cfg.pricing.note)
    if cfg.plot:
        write_plot(cfg.plot, result)
    if cfg.markdown:
        text = render_markdown(result, _command(cfg), plot=_plot_link(cfg))
        _write_markdown(cfg, text)
    if cfg.json:
        print_json(build_report(result), indent=None)
    else:
        render_probe(result)
    if result.failures:
        failures = result.failures
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        raise KolibriError("gate failed: " + "; ".join(failures[:3]) + more)


def _pricing(cfg):
    """The c(n) to price with (a guess where a measurement could be has a note); with
    `--costs measure`, timed now on the goldens' model and kept."""
    from kolibri_cli.probe.pricing import choose, measure_here, measured_model

    if cfg.measure_costs:
        name = measured_model(cfg.goldens)
        model = _load_model(cfg, spec=cfg.model or name)
        from kolibri_cli.cli.render import err, progress_bar

        err.print(f"timing c(n) of {model.name} on this host (kept for later runs) ...")
        with progress_bar("timing c(n) ") as bar:
            return measure_here(model, cfg, lambda d, t: bar("", d, t))
    return choose(cfg.costs, cfg.goldens, cfg.threads, cfg.bench_costs, cfg.engine)


def _refuse_unavailable(cfg) -> None:
    from kolibri_cli.servers import LOCAL, is_server

    if not _in_process(cfg):
        if not cfg.measure:
            raise KolibriError(f"--engine {cfg.engine} is where --measure runs: add --measure")
        if not is_server(cfg.engine):
            raise KolibriError(f"unknown --engine {cfg.engine!r}: kolibri, {LOCAL} or a base URL")
        if cfg.engine != LOCAL and not cfg.baseline:
            raise KolibriError("a speculating server at a URL needs its plain twin for the "
                               "measured speedup: add --baseline URL")
    if cfg.baseline and (_in_process(cfg) or cfg.engine == LOCAL):
        raise KolibriError("--baseline goes with --engine URL (a server you started)")
    if cfg.measure and cfg.ray is not None:
        raise KolibriError("--measure runs the model here, on a few goldens: drop --ray")
    _refuse_unused(cfg)


def _refuse_unused(cfg) -> None:
    """Options (or PROBE.toml keys) that mean nothing in this run: one error line."""
    from kolibri_cli.cli.options import refuse_unused
    from kolibri_cli.probe.config import ProbeConfig
    from kolibri_cli.servers import LOCAL

    if not (cfg.measure or cfg.bench or cfg.measure_costs):
        refuse_unused({"--model": cfg.model}, "--measure, --bench or --costs measure (the "
                      "simulation alone needs no model)")
    if not cfg.measure:
        refuse_unused({"--repeats": cfg.repeats,
                       "--allow-model-mismatch": cfg.allow_model_mismatch or None,
                       **{f"--{key.replace('_', '-')}": value
                          for key, value in cfg.sampling_overrides().items()}}, "--measure")
    if _in_process(cfg):
        timeout = None if cfg.timeout == ProbeConfig.timeout else cfg.timeout
        refuse_unused({"--engine-api": cfg.engine_api, "--gguf": cfg.gguf, "--timeout": timeout},
                      f"--measure on a server (--engine {LOCAL} or a URL)")
    elif cfg.engine == LOCAL:
        refuse_unused({"--engine-api": cfg.engine_api}, "--engine URL")
    else:
        refuse_unused({"--gguf": cfg.gguf}, f"--engine {LOCAL}")


def _check_outputs(cfg) -> None:
    """Every file the run writes can be written (checked now, not after the run), none twice,
    and none is an input: a report over the goldens or PROBE.toml destroyed them."""
    from kolibri_cli.store.atomic import check_writable

    inputs = [Path(p) for p in (*cfg.goldens, cfg.source, cfg.lookup_cache_static,
                                cfg.lookup_cache_dynamic) if p and Path(p).is_file()]
    outputs = [(o, p) for o, p in (("--markdown", cfg.markdown), ("--rows", cfg.rows),
                                   ("--plot", cfg.plot)) if p]
    for option, path in outputs:
        check_writable(path)
        if path.is_file() and any(path.samefile(i) for i in inputs):
            raise KolibriError(f"{option} {path} is an input of this run; name another file")
    targets = [os.path.realpath(p) for _, p in outputs]
    if len(set(targets)) < len(targets):
        raise KolibriError("--markdown, --rows and --plot name the same file; name one each")


def _planned_tasks(cfg, extra: list) -> list:
    from kolibri_cli.probe.shard import plan_tasks

    return plan_tasks(cfg, extra, rows_json=cfg.rows is not None)


def _goldens_in_memory(cfg) -> list:
    from kolibri_cli.probe.config import select_goldens
    from kolibri_cli.probe.shard import ROWS_IN_REPORT

    return select_goldens(cfg, most=ROWS_IN_REPORT)


def _in_memory_tasks(cfg, goldens: list) -> list:
    """One task over goldens held in memory, every per-chain row kept (the measured run needs
    them)."""
    from kolibri_cli.probe.shard import Task, configs_of

    return [Task(tuple(configs_of(cfg)), goldens=tuple(goldens), keep_rows=True,
                 rows_json=cfg.rows is not None)]


def _simulate(cfg, tasks: list) -> tuple:
    """Run the tasks where the options say, with a progress bar (long runs) and the rows file;
    print the throughput when the bar was shown."""
    from kolibri_cli.cli.render_probe import throughput_bar, throughput_line
    from kolibri_cli.probe.shard import ROWS_IN_REPORT, simulate_tasks

    in_memory = len(tasks) == 1 and tasks[0].piece is None
    with _executor(cfg, tasks) as executor, throughput_bar() as bar, \
            _rows_sink(cfg.rows) as on_rows:
        runs, throughput = simulate_tasks(
            tasks, executor.run_all, bar.update, on_rows, executor.workers, executor.name,
            rows_limit=None if in_memory else ROWS_IN_REPORT)
    if bar.shown:
        typer.echo(throughput_line(throughput, len(runs)), err=True)
    if cfg.rows:
        typer.echo(f"wrote {cfg.rows}", err=True)
    if not any(run.chains for run in runs):
        raise KolibriError(f"no goldens of category {', '.join(cfg.category or [])}")
    return runs, throughput


@contextmanager
def _rows_sink(path: Path | None):
    """A callback writing bytes to `path`, atomically: the file appears whole when the run
    succeeds, never half-written."""
    if path is None:
        yield None
        return
    from kolibri_cli.store.atomic import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f.write


def _executor(cfg, tasks: list):
    """Ray if asked; else local worker processes when there is more than one task to share
    (and, unless --workers says how many, enough input to pay for starting them)."""
    from kolibri_cli.probe.shard import PARALLEL_MIN_BYTES
    from kolibri_cli.probe.workers import Here, Processes, RayCluster, cores

    if cfg.ray is not None:
        return RayCluster(cfg.ray, cfg.workers)
    small = sum(t.nbytes for t in tasks) < PARALLEL_MIN_BYTES
    workers = min(cfg.workers or (1 if small else cores()), len(tasks))
    return Processes(workers) if workers > 1 else Here()


def _in_process(cfg) -> bool:
    return cfg.engine in (None, "kolibri")


def _load_model(cfg, weights: bool = True, spec: str | None = None):
    from kolibri_cli.cli.options import fit_context, load_model
    from kolibri_cli.decode.proposers import default_settings

    model = load_model(spec or cfg.model, cfg.threads if weights else None, weights=weights)
    defaults = [default_settings(name) for name in cfg.proposer]  # where k or window is not given
    fit_context(max(cfg.k or [k for k, _ in defaults]),
                max(w[1] for w in (cfg.window or [w for _, w in defaults])), model)
    return model


def _bench_golden(model):
    """The bench chain (a seeded random raw prompt whose continuation cycles) as a golden: its
    output is the model's own greedy chain, generated here."""
    from kolibri_cli.bench.chain import BENCH_NEW_TOKENS, BENCH_SEED, bench_prompt
    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden

    prompt = bench_prompt(model)
    chain = generate_plain(model, prompt, BENCH_NEW_TOKENS).output_ids
    return Golden(f"bench-seed{BENCH_SEED}", "bench", "", False, prompt, chain, model.name,
                  model.sha256, {"engine": "kolibri", "dtype": model.numerics}, list(model.eos_ids))


def _measure(cfg, model, goldens, runs) -> dict:
    """Run the model on every golden for the best simulated configuration (or the only one) —
    of each proposer when comparing, all in one interleaved run so machine noise hits them alike:
    measuring a whole sweep would take minutes per configuration."""
    from kolibri_cli.cli import render
    from kolibri_cli.cli.options import resolve_sampling, sampling_options
    from kolibri_cli.goldens import record as recorder
    from kolibri_cli.probe.answer import best, fastest_per_proposer, ranking
    from kolibri_cli.probe.measure import measure_runs
    from kolibri_cli.probe.pricing import live_runs
    from kolibri_cli.probe.report import run_key

    recorder.check_model_matches(model, goldens, cfg.allow_model_mismatch)
    given = cfg.sampling_overrides()
    override = resolve_sampling(model, sampling_options(**given)) if given else None
    chosen = ([s.run for s in fastest_per_proposer(runs, ranking(runs))]
              if len(cfg.proposer) > 1 else [best(runs)])
    chosen = live_runs(chosen, cfg.pricing)
    if _in_process(cfg):
        names = ", ".join(run.name for run in chosen)
        with render.progress_bar(f"measuring {names} ") as bar:
            measured = measure_runs(model, goldens, chosen, cfg.measure_repeats(),
                                    lambda d, t: bar("", d, t), override)
        _note_divergence(model, measured)
        return measured
    measured = {}
    for run in chosen:
        with render.progress_bar(f"measuring {run.name} on {cfg.engine} ") as bar:
            ticks = lambda d, t: bar("", d, t)  # noqa: E731
            measured[run_key(run)] = _measure_server(cfg, model, goldens, run, ticks, override)
    return measured


def _measure_server(cfg, model, goldens, run, ticks, sampling):
    from kolibri_cli.probe.measure_server import measure_local, measure_urls
    from kolibri_cli.servers import LOCAL

    if cfg.engine == LOCAL:
        return measure_local(model, goldens, run, cfg.measure_repeats(), cfg.threads, cfg.gguf,
                             cfg.timeout, ticks, sampling)
    return measure_urls(model, goldens, run, cfg.engine, cfg.baseline, cfg.measure_repeats(),
                        cfg.costs, cfg.engine_api, cfg.timeout, ticks, sampling)


def _note_divergence(model, measured: dict) -> None:
    """The simulation assumes the model reproduces the goldens: say so when it does not."""
    from kolibri_cli.cli import render
    from kolibri_cli.cli.options import verify_hint
    from kolibri_cli.text import shown

    first = next(iter(measured.values()))
    diverged = [g for g in first.goldens if g.first_divergence is not None]
    if diverged:
        g = diverged[0]
        render.note(f"note: the model's greedy output differs from {len(diverged)} of "
                    f"{len(first.goldens)} goldens (first: {shown(g.id)} at output index "
                    f"{g.first_divergence}), so simulated and real counts may differ"
                    f"{verify_hint(model)}")


def _write_markdown(cfg, text: str) -> None:
    from kolibri_cli.store.atomic import write_text_atomic

    write_text_atomic(cfg.markdown, text)
    from kolibri_cli.cli.render import note

    note(f"wrote {cfg.markdown}")


def _plot_link(cfg) -> Path | None:
    if not (cfg.plot and cfg.markdown):
        return None
    return Path(os.path.relpath(os.path.realpath(cfg.plot),
                                os.path.dirname(os.path.realpath(cfg.markdown))))


def _command(cfg) -> str:
    """The command that regenerates this report (for the Markdown header)."""
    if cfg.source:
        return f"kolibri probe {_rel(cfg.source)}"
    args = ["kolibri", "probe"]
    for path in cfg.goldens:
        args += ["--goldens", _rel(path)]
    if cfg.k:
        args += ["--k", ",".join(map(str, cfg.k))]
    if cfg.window:
        args += ["--window", ",".join(f"{lo}-{hi}" for lo, hi in cfg.window)]
    if cfg.proposer != [DEFAULT_PROPOSER]:
        args += ["--proposer", ",".join(cfg.proposer)]
    if cfg.cross_request:
        args.append("--cross-request")
    if cfg.costs:
        args += ["--costs", ",".join(f"{c:g}" for c in cfg.costs.values())]
    elif cfg.measure_costs:
        args += ["--costs", "measure"]
    elif not cfg.bench_costs:
        args += ["--costs", "default"]
    optional = {"--category": cfg.category and ",".join(cfg.category), "--limit": cfg.limit,
                "--min-hits": cfg.min_hits, "--n-min": cfg.n_min,
                "--lookup-cache-static": cfg.lookup_cache_static and _rel(cfg.lookup_cache_static),
                "--lookup-cache-dynamic": cfg.lookup_cache_dynamic
                and _rel(cfg.lookup_cache_dynamic),
                "--max-tokens": cfg.max_tokens, "--engine": cfg.engine,
                "--baseline": cfg.baseline, "--engine-api": cfg.engine_api,
                "--gguf": cfg.gguf and _rel(cfg.gguf), "--repeats": cfg.repeats,
                "--model": cfg.model, "--threads": cfg.threads,
                "--min-ratio": cfg.min_ratio, "--min-acceptance": cfg.min_acceptance,
                "--min-speedup": cfg.min_speedup}
    optional |= {"--" + key.replace("_", "-"): value
                 for key, value in cfg.sampling_overrides().items()}
    for flag, value in optional.items():
        if value is not None and value != "":
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for text in cfg.gate or []:
        args += ["--gate", text]
    switches = {"--measure": cfg.measure, "--bench": cfg.bench, "--by-category": cfg.by_category,
                "--allow-model-mismatch": cfg.allow_model_mismatch}
    args += [flag for flag, on in switches.items() if on]
    args += ["--markdown", _rel(cfg.markdown)]
    if cfg.plot:
        args += ["--plot", _rel(cfg.plot)]
    return shlex.join(args)


def _rel(path: Path) -> str:
    try:
        return str(Path(os.path.realpath(path)).relative_to(Path.cwd()))
    except ValueError:
        return str(path)
