"""docs/cli.md, generated from the typer app: every command's usage, arguments and options, so
an option is documented once, where it is declared. Nothing here reads the terminal (no width,
no colour), so the page is the same on every machine."""

import sys

import typer
from typer.cli import get_docs_for_click

from kolibri_cli.store.atomic import write_text_atomic

COMMAND = "python -m kolibri_cli.cli.reference docs/cli.md"
TITLE = "`kolibri` command reference"
NOTE = (f"Generated from the typer app by `{COMMAND}`: edit a command's or an option's help in "
        "`kolibri_cli/cli/`, then run that command; do not edit this page.")


def cli_reference() -> str:
    """The whole page: the title, how it is made, then each command and group in turn."""
    from kolibri_cli.cli import app

    command = typer.main.get_command(app)
    body = get_docs_for_click(obj=command, ctx=typer.Context(command), name="kolibri",
                              title=TITLE)
    title, rest = body.split("\n", 1)
    lines = f"{title}\n\n{NOTE}\n{rest}".strip().splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main(argv: list[str]) -> int:
    """`python -m kolibri_cli.cli.reference [PATH]`: the page to PATH (atomically) or stdout."""
    page = cli_reference()
    if argv:
        write_text_atomic(argv[0], page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
