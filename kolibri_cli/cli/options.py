"""Options shared by several commands, declared once, and the CLI's one model loader."""

import json
import sys
from typing import Annotated

import typer

from kolibri_cli.decode.proposers import (
    DEFAULT_PROPOSER,
    DEFAULT_WINDOW,
    PROPOSERS,
    format_window,
)
from kolibri_cli.errors import KolibriError

ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Model name from the cache or a Hugging Face-layout folder "
    "(default: smollm2-135m-instruct, pulled on first use).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", "-t", min=1, help="Kernel threads (default: all cores).")]
KOpt = Annotated[int, typer.Option("--k", help="Most draft tokens per verify pass.")]
WindowOpt = Annotated[str, typer.Option(
    "--window", help="n-gram sizes tried, 'MIN-MAX' or 'N' (longest first).")]
ProposerOpt = Annotated[str, typer.Option(
    "--proposer", help=f"Draft rule: {', '.join(PROPOSERS)}. See docs/probe.md.")]

WINDOW_DEFAULT = format_window(DEFAULT_WINDOW)  # the --window default as typed


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def load_model(spec: str | None, threads: int | None = None):
    """The model named or found at `spec`, pulled on first use, with progress on stderr."""
    from kolibri_cli.cli import render
    from kolibri_cli.store.models import open_model

    if threads:
        from kolibri_cli.engine.jit import set_threads

        set_threads(threads)
    with render.progress_bar() as bar:
        return open_model(spec, notify=render.err.print, progress=bar)


def proposer(k: int, window: str, name: str = DEFAULT_PROPOSER):
    """A fresh proposer from command-line settings (bad settings fail before a model loads)."""
    from kolibri_cli.decode.proposers import make_proposer, parse_window

    if k < 1:  # name the option; make_proposer's own check speaks of "k"
        raise KolibriError(f"--k must be at least 1 (got {k})")
    return make_proposer(name, k, parse_window(window))
