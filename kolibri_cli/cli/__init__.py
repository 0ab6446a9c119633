"""The command line: typer commands that parse, call and render. The only package that imports
typer or rich; `app.py` holds the one place a KolibriError becomes one line on stderr."""

import typer

from kolibri_cli.cli import bench, chat, generate, goldens, model, probe, serve
from kolibri_cli.cli.app import make_typer

app = make_typer("kolibri: would n-gram (prompt-lookup) speculative decoding make this model "
                 "faster?")


def _print_version(value: bool) -> None:
    if value:
        from kolibri_cli import __version__

        typer.echo(f"kolibri {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True,
                                       callback=_print_version, help="Print the version.")):
    pass


app.command()(generate.generate)
app.command()(chat.chat)
app.command()(bench.bench)
app.command()(probe.probe)
app.command()(serve.serve)
app.add_typer(model.app, name="model")
app.add_typer(goldens.app, name="goldens")
