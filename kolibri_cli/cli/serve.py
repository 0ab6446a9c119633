"""`kolibri serve`: the model behind an OpenAI-compatible HTTP API (kolibri_cli/serve), the
access log on stdout (one JSON object per request), notes on stderr."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.cli import options as opt


def serve(
    model: opt.ModelOpt = None,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on; another than 127.0.0.1 exposes the server to "
        "the network (set --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="Port (0: any free one, printed).")] = 8080,
    spec: Annotated[bool, typer.Option(
        "--spec/--no-spec", help="n-gram speculation with the guard (drafting only where it "
        "pays); the text is the same either way.")] = True,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="KOLIBRI_API_KEY", show_default=False,
        help="Bearer key every /v1/, /tokenize and /detokenize request must send (prefer the "
        "variable: arguments show in ps).")] = None,
    record: Annotated[Path | None, typer.Option(
        "--record", metavar="DIR", help="Append every finished request to a golden file in "
        "DIR (kolibri probe -g DIR answers on it).")] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=0, max=100_000, help="Requests that may wait behind the running one; "
        "more are refused with 503 at once.")] = 8,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", min=1, max=10_000_000, show_default=False, help="Most new tokens a "
        "request may ask for (a chat request's default). [default: the model's context]")] = None,
    max_body: Annotated[int, typer.Option(
        "--max-body", min=1024, max=1 << 30, help="Most bytes of a request body.")] = 1 << 20,
    served_model_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="The model id clients ask for. [default: the model's "
        "name]")] = None,
    drain_timeout: Annotated[float, typer.Option(
        "--drain-timeout", min=0, max=1e6, help="Seconds SIGTERM or Ctrl-C waits for requests "
        "in flight.")] = 60.0,
    threads: opt.ThreadsOpt = None,
    quantize: opt.QuantizeOpt = None,
) -> None:
    """Serve the model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics); the same ids with and without speculation."""
    from kolibri_cli.cli import render
    from kolibri_cli.serve import check_installed

    check_installed()
    from kolibri_cli.serve.requests import Limits
    from kolibri_cli.serve.run import ServeConfig, exposure_note
    from kolibri_cli.serve.run import serve as run
    from kolibri_cli.store.models import check_runs_here

    if exposed := exposure_note(host, api_key):
        render.note(exposed)
    cfg = ServeConfig(host, port, spec, api_key or None, record,
                      Limits(max_tokens, max_body, max_queue), threads, served_model_name,
                      drain_timeout)
    mode = "speculation on (guard)" if spec else "speculation off"

    def listening(url: str) -> None:
        render.note(f"kolibri serve: listening on {url}; loading the model (/health answers 503 "
                    "until it is ready) ...")

    def ready(url: str, m) -> None:
        render.note(f"kolibri serve: {url} ({cfg.name or m.name}, {mode}); access log on "
                    "stdout; Ctrl-C or SIGTERM drains and stops")

    def load(stage):
        def preparing(what: str, done: int, total: int) -> None:
            stage(f"compiling or loading {what} ({done + 1} of {total})")

        return opt.load_model(model, threads, quantize=quantize, preparing=preparing)

    check_runs_here(model)
    run(load, cfg, listening, ready, _log_line, _note)


def _note(text: str) -> None:
    """A note from the server's threads, as it is (a traceback keeps its lines)."""
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def _log_line(entry: dict) -> None:
    """One access-log line on stdout (a closed stdout ends the log, not the server)."""
    import json

    try:
        sys.stdout.write(json.dumps(entry, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
