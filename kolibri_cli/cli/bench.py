"""`kolibri bench`: plain vs speculative speed, c(n), and the memory-bandwidth bound."""

from typing import Annotated

import typer

from kolibri_cli.cli import options as opt
from kolibri_cli.decode.proposers import DEFAULT_K, DEFAULT_PROPOSER


def bench(
    model: opt.ModelOpt = None,
    k: opt.KOpt = DEFAULT_K,
    window: opt.WindowOpt = opt.WINDOW_DEFAULT,
    proposer_name: opt.ProposerOpt = DEFAULT_PROPOSER,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1,
                                         help="Repeats; medians are reported.")] = 5,
    temperature: opt.TemperatureOpt = None,
    top_k: opt.TopKOpt = None,
    top_p: opt.TopPOpt = None,
    min_p: opt.MinPOpt = None,
    repetition_penalty: opt.RepetitionPenaltyOpt = None,
    seed: opt.SeedOpt = None,
    greedy: opt.GreedyOpt = False,
    threads: opt.ThreadsOpt = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Time c(1..k+1) of an inference server instead: llama-server (started "
        "here on the model's GGUF; timed in its decode loop with synthetic acceptance), or a "
        "llama.cpp server's base URL (timed by prompt evaluation). [default: kolibri]")] = None,
    engine_api: opt.EngineApiOpt = None,
    gguf: opt.GgufOpt = None,
    timeout: opt.TimeoutOpt = 600.0,
    as_json: opt.JsonOpt = False,
) -> None:
    """Plain vs spec tok/s on the bench chain, c(n), the memory-bandwidth bound and the cost of
    choosing tokens (sampling noise included), all from one run; with --engine, the c(n) of an
    inference server."""
    from kolibri_cli.bench.run import run_bench
    from kolibri_cli.cli import render
    from kolibri_cli.engine.jit import get_threads

    if engine not in (None, "kolibri"):
        return _bench_servers(engine, model, k, repeats, threads, engine_api, gguf, timeout,
                              as_json)
    drafter = opt.proposer(k, window, proposer_name)  # bad settings fail before the model loads
    given = opt.sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    m = opt.load_model(model, threads)
    opt.fit_context(drafter.k, drafter.window_max, m)
    how = opt.resolve_sampling(m, given)
    render.err.print(f"benchmarking {m.name}: {repeats} repeats, {get_threads()} threads ...")
    result = run_bench(m, lambda: opt.proposer(k, window, proposer_name), repeats, get_threads(),
                       how)
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.bench_table(result))


def _bench_servers(engine, model, k, repeats, threads, api, gguf, timeout, as_json) -> None:
    from kolibri_cli.bench import server as sb
    from kolibri_cli.cli import render
    from kolibri_cli.errors import KolibriError
    from kolibri_cli.servers import LOCAL, connect, is_server

    if not is_server(engine):
        raise KolibriError(f"unknown --engine {engine!r}: kolibri, {LOCAL} or a llama.cpp "
                           "server's base URL")
    m = opt.load_model(model, weights=False)
    prompt = sb.periodic_prompt(m)
    with render.progress_bar("timing passes ") as bar:
        ticks = lambda d, t: bar("", d, t)  # noqa: E731
        if engine == LOCAL:
            render.err.print(f"starting {k + 1} llama-servers ...")
            with sb.cost_servers(m, k + 1, gguf, threads, timeout) as servers:
                result = sb.measure_costs(servers, prompt, repeats, LOCAL, threads, ticks)
        else:
            server = connect(engine, api or "llama.cpp", m.tokenizer, m.eos_ids, timeout)
            if server.api != "llama.cpp":
                raise KolibriError("c(n) from a URL needs llama.cpp's per-request timings; for "
                                   "other servers pass c(n) to the probe with --costs")
            result = sb.prompt_eval_costs(server, prompt, k + 1, repeats, engine, ticks)
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.server_costs_table(result))
