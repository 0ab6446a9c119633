"""The command line's one error boundary against what a hostile user or environment does: a file
it may not read, SIGTERM mid-write, options with no explanation in --help."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COMPILING

from kolibri_cli.cli import app

# SIGTERM arrives while the goldens file is half written to its temporary: the process must clean
# up like on Ctrl-C (no temporary left, no target file) and exit 143 with one line.
_TERMINATED_MID_WRITE = """
import os, signal, sys, time
from pathlib import Path
from kolibri_cli.cli import app

real = Path.write_text

def half_then_sigterm(self, text, *args, **kwargs):
    real(self, text[: len(text) // 2], *args, **kwargs)
    if self.name.startswith(".") and self.name.endswith(".tmp"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

Path.write_text = half_then_sigterm
app(sys.argv[1:], prog_name="kolibri")
"""


def _kolibri_env(home: Path) -> dict:
    env = dict(os.environ, KOLIBRI_HOME=str(home), KOLIBRI_OFFLINE="1")
    env.pop("KOLIBRI_DEBUG", None)
    return env


def _stderr_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and COMPILING not in line]


def test_sigterm_mid_write_cleans_up_and_exits_143(tmp_path, tiny_llama_folder):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nworld\n")
    out = tmp_path / "out"
    out.mkdir()
    args = ["goldens", "record", "--engine", "kolibri", "-m", str(tiny_llama_folder()),
            "-p", str(prompts), "-o", str(out / "g.jsonl"), "-n", "2"]
    p = subprocess.run([sys.executable, "-c", _TERMINATED_MID_WRITE, *args], capture_output=True,
                       text=True, env=_kolibri_env(tmp_path / "home"), timeout=300)
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert _stderr_lines(p.stderr)[-1] == "terminated", p.stderr
    assert list(out.iterdir()) == []  # neither the goldens nor a temporary


def test_sigterm_handler_is_only_installed_while_a_command_runs():
    from typer.testing import CliRunner

    before = signal.getsignal(signal.SIGTERM)
    assert CliRunner().invoke(app, ["model", "list", "--help"]).exit_code == 0
    assert signal.getsignal(signal.SIGTERM) is before


def _without_read_override() -> list[str]:
    """A prefix that makes root obey file permissions (tests often run as root in containers)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file permissions cannot be tested")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.parametrize("what", ["weights", "folder"])
def test_unreadable_model_files_are_one_line(tmp_path, tiny_llama_folder, what):
    folder = tiny_llama_folder()
    locked = folder / "model.safetensors" if what == "weights" else folder
    locked.chmod(0)
    try:
        kolibri = [*_without_read_override(), sys.executable, "-m", "kolibri_cli"]
        for args in (["model", "info", str(folder)], ["generate", "-m", str(folder), "hi"]):
            p = subprocess.run([*kolibri, *args], capture_output=True, text=True,
                               env=_kolibri_env(tmp_path / "home"), timeout=300)
            lines = _stderr_lines(p.stderr)
            assert p.returncode == 1 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
            assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
            assert "internal error" not in lines[0] and "permission denied" in lines[0], lines[0]
    finally:
        locked.chmod(0o755)
