"""`kolibri generate`: text at the terminal, plain or n-gram speculative (the same ids, greedy or
sampled)."""

import sys
from typing import Annotated

import typer

from kolibri_cli.cli import options as opt
from kolibri_cli.decode.proposers import DEFAULT_SPEC_PROPOSER
from kolibri_cli.errors import KolibriError


def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from stdin.")],
    model: opt.ModelOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Most new tokens.")] = 256,
    raw: Annotated[bool, typer.Option("--raw", help="No chat template: the bare prompt.")] = False,
    spec: Annotated[bool, typer.Option("--spec", help="n-gram speculative decoding.")] = False,
    k: opt.KOpt = None,
    window: opt.WindowOpt = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Run plain then spec, check identical ids, print both speeds.")] = False,
    proposer_name: opt.SpecProposerOpt = None,
    costs: opt.CostsOpt = None,
    min_hits: opt.MinHitsOpt = None,
    n_min: opt.NMinOpt = None,
    lookup_cache_static: opt.StaticCacheOpt = None,
    lookup_cache_dynamic: opt.DynamicCacheOpt = None,
    temperature: opt.TemperatureOpt = None,
    top_k: opt.TopKOpt = None,
    top_p: opt.TopPOpt = None,
    min_p: opt.MinPOpt = None,
    repetition_penalty: opt.RepetitionPenaltyOpt = None,
    seed: opt.SeedOpt = None,
    greedy: opt.GreedyOpt = False,
    system: opt.SystemOpt = None,
    stop: opt.StopOpt = None,
    escape: opt.EscapeOpt = True,
    threads: opt.ThreadsOpt = None,
    quantize: opt.QuantizeOpt = None,
    as_json: opt.JsonOpt = False,
) -> None:
    """Generate text, plainly or with n-gram speculation: the same ids either way, greedy or
    sampled (the noise is keyed by seed and position)."""
    from kolibri_cli.cli import render
    from kolibri_cli.cli.app import interrupt_between_tokens
    from kolibri_cli.decode import drafting
    from kolibri_cli.decode.generate import generate_plain, generate_spec
    from kolibri_cli.decode.prompt import prompt_ids

    if max_tokens < 1:
        raise KolibriError(f"--max-tokens must be at least 1 (got {max_tokens})")
    given = opt.sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    llamacpp = opt.llamacpp_options(min_hits, n_min, lookup_cache_static, lookup_cache_dynamic)
    given_proposer, proposer_name = proposer_name, proposer_name or DEFAULT_SPEC_PROPOSER
    draft = drafting.Drafting.checked(k, window, proposer_name, llamacpp, costs)  # even unused
    drafter = draft.settings() if (spec or compare) else None
    if drafter is None:
        opt.refuse_unused({"--k": k, "--window": window, "--min-hits": min_hits,
                           "--n-min": n_min, "--lookup-cache-static": lookup_cache_static,
                           "--lookup-cache-dynamic": lookup_cache_dynamic, "--costs": costs,
                           "--proposer": given_proposer},
                          "--spec or --compare")
    text = opt.read_prompt(prompt, escape)
    system, stop = opt.typed(system, escape, "--system"), opt.typed_stops(stop, escape)
    m = opt.load_model(model, threads, quantize=quantize, drafter=drafter)
    if drafter:
        drafter = draft.for_model(m, render.note).new()
        opt.fit_context(drafter.k, drafter.window_max, m)
    pricing = draft.pricing
    ids, max_tokens = prompt_ids(m, text, raw, max_tokens, system, render.note)
    how = {"sampling": opt.resolve_sampling(m, given), "stop": stop}
    if compare:
        return _compare(m, ids, max_tokens, drafter, as_json, how, draft)
    streamer = None if as_json else render.TextStreamer(m.tokenizer, how["stop"])
    try:
        with interrupt_between_tokens(streamer) as on_tokens:
            if drafter:
                result = generate_spec(m, ids, max_tokens, drafter, on_tokens, **how)
            else:
                result = generate_plain(m, ids, max_tokens, on_tokens, **how)
    finally:
        if streamer:
            streamer.finish()
    if drafter:
        draft.keep(drafter.costs, render.note)
    if as_json:
        return opt.print_json(_with_proposer(result.to_dict(m.name, m.numerics), drafter, pricing))
    render.err.print(stats_line(result), highlight=False)


def stats_line(result) -> str:
    """The one stats line on stderr after a generation (chat prints one per turn)."""
    speed = (f"{result.decode_tokens_per_s:.1f} tok/s" if result.new_tokens > 1 else
             "n/a (prefill made the one token)")
    s = (f"prompt {len(result.prompt_ids)} tokens, prefill {result.prefill_s * 1e3:.0f} ms, "
         f"{result.new_tokens} new tokens, decode {speed}")
    if result.mode == "spec":
        st = result.spec_stats()
        s += (f", {st['verify_passes']} verify passes, "
              f"{st['drafts_accepted']}/{st['drafts_proposed']} drafts accepted")
    s += f", {result.sampling.describe()}"
    if not result.sampling.greedy and result.decode_s > 0:
        s += f" (sampling {result.sample_s / result.decode_s:.1%} of decode time)"
    return s + ("" if result.stop_reason == "eos" else f", stopped by {result.stop_reason}")


def _with_proposer(obj: dict, drafter, pricing=None) -> dict:
    """The proposer's settings, and where the c(n) it drafted by came from (when it took any)."""
    if drafter is None:
        return obj
    return obj | {"proposer": drafter.name, "k": drafter.k,
                  "window": [drafter.window_min, drafter.window_max]} | (
        {"pricing": pricing.to_json()} if pricing else {})


def _compare(m, ids, max_tokens, drafter, as_json: bool, how: dict, draft) -> None:
    from kolibri_cli.cli import render
    from kolibri_cli.decode.generate import compare

    both = compare(m, ids, max_tokens, drafter, **how)
    draft.keep(drafter.costs, render.note)
    pricing = draft.pricing
    plain, spec, ratio = both.plain, both.spec, both.speedup
    if as_json:
        opt.print_json({"identical": both.identical, "speedup": ratio,
                        "plain": plain.to_dict(m.name, m.numerics),
                        "spec": _with_proposer(spec.to_dict(m.name, m.numerics), drafter,
                                               pricing)})
    else:
        sys.stdout.write(plain.text + "\n")  # model text: never read as rich markup
        render.err.print(f"plain: {stats_line(plain)}", highlight=False)
        render.err.print(f"spec:  {stats_line(spec)}", highlight=False)
        speed = "n/a (nothing decoded after prefill)" if ratio is None else f"{ratio:.2f}x"
        render.err.print(f"spec / plain decode speed: {speed}; ids identical: {both.identical}")
    both.check()
