"""Shell completion: `kolibri --install-completion` / `--show-completion`, and the answers the
installed script gets back from kolibri (typer's protocol: _KOLIBRI_COMPLETE in the environment)."""

import os
import subprocess
import sys


def _kolibri(args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kolibri_cli", *args], capture_output=True,
                          text=True, env=os.environ | env, timeout=120)


def test_the_bash_script_is_shown():
    proc = _kolibri(["--show-completion", "bash"])
    assert proc.returncode == 0, proc.stderr
    assert "complete -o default -F _kolibri_completion kolibri" in proc.stdout


def test_commands_subcommands_and_options_complete():
    def complete(line: str) -> list[str]:
        words = line.split(" ")
        proc = _kolibri([], _KOLIBRI_COMPLETE="complete_bash", COMP_WORDS=line,
                        COMP_CWORD=str(len(words) - 1))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("kolibri mo") == ["model"]
    assert {"pull", "import", "list", "verify", "info", "rm"} <= set(complete("kolibri model "))
    assert complete("kolibri generate --tempe") == ["--temperature"]
