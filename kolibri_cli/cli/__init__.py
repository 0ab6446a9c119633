"""The command line: typer commands that parse, call and render. The only package that imports
typer or rich; `app.py` holds the one place a KolibriError becomes one line on stderr."""

from kolibri_cli.cli import bench, generate, goldens, model, probe
from kolibri_cli.cli.app import make_typer

app = make_typer("kolibri: would n-gram (prompt-lookup) speculative decoding make this model "
                 "faster?")
app.command()(generate.generate)
app.command()(bench.bench)
app.command()(probe.probe)
app.add_typer(model.app, name="model")
app.add_typer(goldens.app, name="goldens")
