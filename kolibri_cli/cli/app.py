"""The typer app factory and the one error boundary of the command line."""

import os

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


def make_typer(help: str) -> typer.Typer:
    return typer.Typer(cls=_Group, help=help, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, rich_markup_mode=None)
