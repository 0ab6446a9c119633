"""cli/reference.py: docs/cli.md is the typer app's own description of every command, current
and the same on every machine."""

import os
import subprocess
import sys
from pathlib import Path

import typer
import typer.main

from kolibri_cli.cli import app
from kolibri_cli.cli.reference import COMMAND, cli_reference

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "cli.md"


def _commands(command, path=("kolibri",)):
    """(full name, click command) for the app, each group and each command in it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_docs_cli_md_is_current():
    assert PAGE.read_text() == cli_reference(), (
        f"docs/cli.md is stale (a command or option changed): regenerate it with `{COMMAND}`")


def test_the_page_says_how_it_is_made():
    head = "\n".join(PAGE.read_text().splitlines()[:3])
    assert f"`{COMMAND}`" in head and "do not edit" in head


def test_every_command_and_option_is_on_the_page():
    page = cli_reference()
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) > 10  # the five commands, two groups and their subcommands
    for path, command in commands:
        heading = f"`{' '.join(path)}`\n"  # the app itself is the page's title
        assert heading in page or path == ("kolibri",), path
        section = page.split(heading, 1)[-1]  # this command's section and those after it
        ctx = typer.Context(command)
        for param in command.get_params(ctx):
            if param.get_help_record(ctx) is not None:  # hidden options are left out
                assert f"* `{param.get_help_record(ctx)[0]}`" in section, (path, param.name)


def test_the_command_writes_the_page_whatever_the_terminal(tmp_path):
    """The module run as the page says, from another folder, with a narrow terminal that asks
    for colour: the same bytes as the function."""
    env = {**os.environ, "COLUMNS": "40", "TERMINAL_WIDTH": "40", "FORCE_COLOR": "1",
           "KOLIBRI_HOME": str(tmp_path / "home")}
    argv = COMMAND.split()[1:-1]  # `-m kolibri_cli.cli.reference`, to our own path
    out = subprocess.run([sys.executable, *argv, str(tmp_path / "cli.md")], cwd=tmp_path,
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "", out.stderr[-2000:]
    assert (tmp_path / "cli.md").read_text() == cli_reference()
