"""Options shared by several commands, declared once, and the CLI's one model loader."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.decode.proposers import (
    DEFAULT_K,
    DEFAULT_PROPOSER,
    DEFAULT_SPEC_PROPOSER,
    GUARD_K,
    PROPOSERS,
    LlamaCppOptions,
    fit_context,  # noqa: F401  (commands import it here)
)
from kolibri_cli.decode.sampling import OPTION_HELP as SAMPLING_HELP
from kolibri_cli.decode.sampling import given_options as sampling_options  # noqa: F401
from kolibri_cli.errors import KolibriError, refuse_unused  # noqa: F401
from kolibri_cli.store.models import verify_hint  # noqa: F401

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Model name from the cache, a Hugging Face-layout folder, or a GGUF "
    "file (imported into the cache on first use, as `kolibri model import` does) (default: "
    "smollm2-135m-instruct, pulled on first use).")]
TokenizerModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Whose tokenizer and chat template make the ids: a model name from "
    "the cache, a folder (its tokenizer files are enough: no weights needed), or a GGUF file "
    "(only its metadata is read; nothing is imported). [default: with --engine URL the server's "
    "own tokenizer, else smollm2-135m-instruct]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", "-t", min=1, help="Kernel threads (default: all cores).")]
KOpt = Annotated[int | None, typer.Option(
    "--k", help="Most draft tokens per verify pass (tree proposers: tree nodes). [default: "
    f"{DEFAULT_K}; guard: {GUARD_K}; llama.cpp's types and the tree proposers: their own, see "
    "docs/proposers.md]")]
WindowOpt = Annotated[str | None, typer.Option(
    "--window", help="n-gram sizes tried, 'MIN-MAX' or 'N' (longest first; llama.cpp's types: "
    "n = MAX). [default: 1-4, or the proposer's own]")]
# llama.cpp's per-type options (generate, chat, bench, serve and probe, which declares its own
# in its --help panels with these texts)
MIN_HITS_HELP = "llamacpp-map-k4v: key hits before it drafts. [default: 1]"
N_MIN_HELP = "llamacpp-mod: fewest chained tokens that make a draft. [default: 48]"
STATIC_CACHE_HELP = ("llamacpp-cache: a llama.cpp static n-gram cache file "
                     "(llama-lookup-create).")
DYNAMIC_CACHE_HELP = "llamacpp-cache: a llama.cpp dynamic n-gram cache file."
MinHitsOpt = Annotated[int | None, typer.Option("--min-hits", min=1, help=MIN_HITS_HELP)]
NMinOpt = Annotated[int | None, typer.Option("--n-min", min=0, help=N_MIN_HELP)]
StaticCacheOpt = Annotated[Path | None, typer.Option("--lookup-cache-static",
                                                     help=STATIC_CACHE_HELP)]
DynamicCacheOpt = Annotated[Path | None, typer.Option("--lookup-cache-dynamic",
                                                      help=DYNAMIC_CACHE_HELP)]
QuantizeOpt = Annotated[str | None, typer.Option(
    "--quantize", help="float32: float32 arithmetic on the stored weights (the reference's "
    "numbers); q8_0: the float32 weights quantized to Q8_0 blocks (made at load); int8: the "
    "Q4_1/Q8_0 blocks times activations quantized to int8 per 32 values, integer dot products "
    "as llama.cpp computes them; int16: the same with activations quantized to int16 per 16 "
    "values. [default: int16 for a model of Q4_1/Q8_0 blocks on a CPU with AVX2 and F16C, "
    "else float32]")]
PROPOSER_HELP = f"Draft rule: {', '.join(PROPOSERS)}. See docs/proposers.md."
# None when not given (a run that drafts nothing refuses it); the command fills in the default
ProposerOpt = Annotated[str | None, typer.Option(
    "--proposer", metavar="<str>", help=f"{PROPOSER_HELP} [default: {DEFAULT_PROPOSER}]")]
SpecProposerOpt = Annotated[str | None, typer.Option(
    "--proposer", metavar="<str>", help=f"{PROPOSER_HELP} [default: {DEFAULT_SPEC_PROPOSER}, "
    "kolibri's cost-aware rule: each draft as long as pays, none where none would; `kolibri "
    "probe` defaults to vllm, the fixed rule other engines run (docs/probe.md)]")]
CostsOpt = Annotated[str | None, typer.Option(
    "--costs", metavar="C1,C2,...|default", help="Forward costs c(1),c(2),... adaptive and "
    "adaptive-tree draft by, as `kolibri probe --costs` takes them; default = the guess, "
    "ignoring stored benches. [default: the c(n) `kolibri bench` stored for this model, numerics "
    "and thread count, else the guess] The guard times its own c(n) unless given numbers here.")]

EngineApiOpt = Annotated[str | None, typer.Option(
    "--engine-api", help="API of the server at --engine URL: llama.cpp, vllm, kolibri (kolibri "
    "serve), or openai (text only: answers are re-tokenized). [default: detected]")]
GGUF_HELP = "GGUF for --engine llama-server. [default: the model's own]"  # probe's too
GgufOpt = Annotated[Path | None, typer.Option("--gguf", help=GGUF_HELP)]
TimeoutOpt = Annotated[float, typer.Option(  # max: engines.transport.MAX_TIMEOUT (a test checks)
    "--timeout", min=1, max=1e6,
    help="Seconds for the whole of one server answer (retries included).")]
ServedModelOpt = Annotated[str | None, typer.Option(
    "--served-model", help="Model id to request from an OpenAI-style server. [default: its "
    "first]")]


def print_json(obj, indent: int | None = 2) -> None:
    """Strict JSON on stdout: a NaN or infinity is a bug to report, never an invalid document."""
    sys.stdout.write(json.dumps(obj, indent=indent, allow_nan=False) + "\n")
    sys.stdout.flush()


def load_model(spec: str | None, threads: int | None = None, *, weights: bool = True,
               quantize: str | None = None, drafter=False, preparing=None):
    """The model named or found at `spec`, pulled on first use, with progress on stderr;
    `weights=False` when only its tokenizer is needed (a server runs the model); `quantize`:
    that numeric path (`engine.weights.STORAGE`), None = the model's default. The kernel is
    compiled (or loaded) for what the command will run: plain decoding (drafter None), with a
    chain or a tree drafter, or (default) everything; `preparing` (a `callbacks.Preparing`) is
    told of each part, as the progress line is."""
    from kolibri_cli.bench import warm
    from kolibri_cli.cli import render
    from kolibri_cli.engine.weights import STORAGE
    from kolibri_cli.store.models import open_model

    if quantize is not None and quantize not in STORAGE:
        raise KolibriError(f"--quantize must be {', '.join(STORAGE)} (got {quantize!r})")
    if threads:
        from kolibri_cli.engine.jit import set_threads

        set_threads(threads)
    kernels = _kernels(drafter)
    with render.progress_bar() as bar:
        if weights and kernels != ("lean",):  # more than plain decoding: the background's work
            warm.wait(render.note, bar.preparing, bar.compiling)
        model = open_model(spec, notify=render.note, progress=bar, weights=weights,
                           numerics=quantize, compiling=bar.compiling, kernels=kernels,
                           preparing=_both(bar.preparing, preparing))
    # only after plain decoding: a command that compiled more (spec, bench, serve, probe) may
    # time what it runs, and a compile beside it would take its cores
    if weights and kernels == ("lean",) and warm.start(model):
        render.note("note: compiling kolibri's other paths (speculative decoding, sampling, "
                    "bench) in the background, at low priority, once per machine")
    return model


def _both(shown, told):
    if told is None:
        return shown

    def both(*args) -> None:
        shown(*args)
        told(*args)
    return both


def _kernels(drafter) -> tuple[str, ...] | None:
    """The kernel specializations a command with this drafter runs (engine.kernel.KERNELS):
    None (all) for `False`, the default."""
    if drafter is False:
        return None
    if drafter is None:
        return ("lean",)
    return ("lean", "verify", "tree") if drafter.trees else ("lean", "verify")


def load_tokenizer(spec: str | None, engine: str | None = None, api: str | None = None,
                   timeout: float = 600.0, served_model: str | None = None):
    """What tokenizes for a run whose model runs elsewhere, or nowhere (engines.tokenizing_model):
    `spec`'s tokenizer (no weights read), or a server's own; progress on stderr."""
    from kolibri_cli.cli import render
    from kolibri_cli.engines import tokenizing_model

    with render.progress_bar() as bar:
        return tokenizing_model(spec, engine, api, timeout, served_model, render.note, bar)


def refuse_with(options: dict, other: str, why: str) -> None:
    """Options given (not None) that mean nothing together with `other`: one error line."""
    if given := [name for name, value in options.items() if value is not None]:
        verb = "does" if len(given) == 1 else "do"
        raise KolibriError(f"{', '.join(given)} {verb} not apply with {other}: {why}")


def read_prompt(prompt: str, escape: bool = False) -> str:
    """The prompt argument (its escapes read when `escape`), or stdin for "-" (as it is: a file
    holds its newlines, and code its backslashes), as valid UTF-8 text (checked before any model
    loads: the tokenizer cannot encode anything else)."""
    if prompt == "-":
        text = check_utf8(_stdin_text(), "the prompt")
    else:
        text = typed(prompt, escape, "the prompt")
    if not text.strip():
        raise KolibriError("the prompt is empty")
    return text


def typed(text: str | None, escape: bool, what: str) -> str | None:
    """An argument as typed, valid UTF-8, its escapes read when `escape` (text.process_escapes)."""
    from kolibri_cli.text import process_escapes

    if text is None:
        return None
    text = check_utf8(text, what)
    return process_escapes(text, what) if escape else text


def typed_stops(stops: list[str] | None, escape: bool) -> list[str]:
    return [typed(s, escape, "a --stop string") for s in stops or []]


def check_utf8(text: str, what: str) -> str:
    """`text` unless it holds a lone surrogate: how Python keeps an undecodable byte of an
    argument (or of stdin in the C locale)."""
    bad = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
    if bad is not None:
        code = ord(text[bad])
        byte = f"byte 0x{code - 0xDC00:02x}" if code >= 0xDC80 else "a lone surrogate"
        raise KolibriError(f"{what} is not valid UTF-8 ({byte} at character {bad}); "
                           "pass UTF-8 text")
    return text


def _stdin_text() -> str:
    data = sys.stdin.buffer.read() if sys.stdin is not None else b""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KolibriError(f"the prompt on stdin is not valid UTF-8 (byte 0x{data[e.start]:02x} "
                           f"at offset {e.start}); convert it, e.g. iconv -f latin1 -t utf-8"
                           ) from None


def llamacpp_options(min_hits: int | None, n_min: int | None, static: Path | None,
                     dynamic: Path | None) -> LlamaCppOptions:
    return LlamaCppOptions(min_hits, n_min, static, dynamic)


# ---- sampling: shared by generate, chat, goldens record, bench and probe ---------------------

TemperatureOpt = Annotated[float | None, typer.Option(
    "--temperature", help=SAMPLING_HELP["temperature"])]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help=SAMPLING_HELP["top_k"])]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help=SAMPLING_HELP["top_p"])]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help=SAMPLING_HELP["min_p"])]
RepetitionPenaltyOpt = Annotated[float | None, typer.Option(
    "--repetition-penalty", help=SAMPLING_HELP["repetition_penalty"])]
SeedOpt = Annotated[int | None, typer.Option("--seed", help=SAMPLING_HELP["seed"])]
GreedyOpt = Annotated[bool, typer.Option(
    "--greedy", help="Argmax decoding, whatever generation_config.json says.")]
SystemOpt = Annotated[str | None, typer.Option(
    "--system", help="System message (replaces the chat template's default one).")]
StopOpt = Annotated[list[str] | None, typer.Option(
    "--stop", metavar="STRING", help="Stop once the text contains STRING (repeatable).")]
EscapeOpt = Annotated[bool, typer.Option(
    "--escape/--no-escape", help="Read \\n \\r \\t \\' \\\" \\\\ and \\xHH in the "
    "prompt, --system and --stop as llama.cpp does (a shell passes \"\\n\" as a backslash and "
    "an n); --no-escape: backslashes as typed. A prompt read from stdin is taken as it is.")]


def resolve_sampling(model, given: dict):
    """The Sampling the run uses (decode/sampling.py decides), its notes on stderr."""
    from kolibri_cli.cli import render
    from kolibri_cli.decode.sampling import resolve

    return resolve(model, given, render.note)
