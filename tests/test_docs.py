"""docs/ is reference, not a lab notebook: every page listed in the README (reference or
concepts), each written page short enough to read in one sitting, no dated run log."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
# Written by a command named in the page's first lines; exempt from the length guideline.
GENERATED = {"cli.md": "python -m kolibri_cli.cli.reference docs/cli.md",
             "feasibility.md": "python probes/feasibility.py"}
MOST_LINES = 250
# A date, a clock time, or words that only make sense in a diary.
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d\b|\bthis session\b|\bthe session's\b"
                   r"|\byesterday\b|\blast week\b|\bthis morning\b|\bthat morning\b")


def test_there_are_pages():
    assert len(PAGES) > 10 and set(GENERATED) <= {p.name for p in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_is_listed_in_the_readme(page):
    assert f"(docs/{page.name})" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_written_page_is_short_enough_and_a_generated_one_says_how(page):
    lines = page.read_text().splitlines()
    if page.name in GENERATED:
        assert GENERATED[page.name] in "\n".join(lines[:3])
    else:
        assert len(lines) <= MOST_LINES, f"docs/{page.name}: split it rather than cut it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_dated_run_log(page):
    """History belongs in commit messages: a figure names its command and commit, not a day."""
    dated = [f"{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
             if DATED.search(line)]
    assert dated == [], f"docs/{page.name}"


def test_the_patterns_catch_a_diary():
    assert DATED.search("Taken 2026-11-30 11:13-11:36 UTC at commit 9994d49")
    assert DATED.search("the 09:27 and 09:59 chat runs")
    assert DATED.search("under this session's CPU lock")
    assert not DATED.search("c(6) 2.25-2.29 at commit 3692efc, 1-minute load average 1.8")


def test_ci_runs_the_readmes_test_command_verbatim():
    """The README opens with two commands; CI runs the second, the tests, character for
    character (a flag added in CI alone would test another command than the one users run)."""
    fence = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = fence.strip().splitlines()
    assert len(commands) == 2 and "kolibri generate" in commands[0] and "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.model
def test_the_readmes_stop_example_stops_on_the_default_model(pulled_default, monkeypatch):
    """The README's `--stop "\\n\\n"` example, run as a shell passes it (a backslash and an n),
    ends at its stop string, not at the end of the answer or of --max-tokens."""
    import json
    import shlex

    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("kolibri generate --stop "))
    args = shlex.split(line.split("#", 1)[0])[1:]
    assert args[args.index("--stop") + 1] == "\\n\\n"  # as bash passes it
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["stop_reason"] == "stop" and answer["text"].strip(), answer
