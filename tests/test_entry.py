"""The `kolibri` entry point (kolibri_cli/__main__.py) through a real pseudo-terminal: while a
first run's imports compile bytecode, a live line names the module being imported; a Ctrl-C
during the imports ends with one line and exit 130, not a traceback."""

import io
import os
import signal
import subprocess
import sys

import pytest

from kolibri_cli import __version__

pexpect = pytest.importorskip("pexpect")


def _as_from_a_shell() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _cold_env(tmp_path) -> dict:
    """No cached bytecode anywhere (an empty pycache prefix, never written): every import
    compiles, as on a first run after `pip install --no-compile`."""
    return os.environ | {"PYTHONPYCACHEPREFIX": str(tmp_path / "pycache"),
                         "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "200", "TERM": "dumb"}


def _spawn(args: list[str], env: dict) -> "pexpect.spawn":
    child = pexpect.spawn(sys.executable, ["-m", "kolibri_cli", *args], env=env,
                          encoding="utf-8", timeout=120, dimensions=(50, 200),
                          preexec_fn=_as_from_a_shell)
    child.logfile_read = io.StringIO()
    return child


def test_a_first_runs_imports_show_a_live_line_then_clear_it(tmp_path):
    child = _spawn(["--version"], _cold_env(tmp_path))
    child.expect(r"starting: \d+ modules imported \(Python compiles those not cached yet\): "
                 r"[\w.]+")
    child.expect(f"kolibri {__version__}")
    child.expect(pexpect.EOF)
    child.close()
    shown = child.logfile_read.getvalue()
    assert child.exitstatus == 0, shown
    names = {part.rsplit(": ", 1)[-1].strip() for part in shown.split("\r") if "starting:" in part}
    assert len(names) > 1, shown  # it moved: more than one module named
    assert "starting:" not in shown.rsplit(f"kolibri {__version__}", 1)[1], shown


def test_ctrl_c_during_the_imports_is_one_line_and_exit_130(tmp_path):
    child = _spawn(["--version"], _cold_env(tmp_path))
    child.expect("starting: ")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    shown = child.logfile_read.getvalue()
    assert child.exitstatus == 130, shown
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown
    assert shown.strip().splitlines()[-1].strip() == "interrupted", shown


def test_no_line_without_a_terminal(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "--version"], capture_output=True,
                          text=True, env=_cold_env(tmp_path), timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"kolibri {__version__}"
    assert proc.stderr == ""


def test_no_line_when_the_bytecode_is_cached():
    env = os.environ | {"TERM": "dumb"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    child = pexpect.spawn(sys.executable, ["-m", "kolibri_cli", "--version"], env=env,
                          encoding="utf-8", timeout=120, preexec_fn=_as_from_a_shell)
    child.logfile_read = io.StringIO()
    child.expect(pexpect.EOF)
    child.close()
    shown = child.logfile_read.getvalue()
    from kolibri_cli.__main__ import _compiles

    if _compiles("numba"):
        pytest.skip("this environment has no cached bytecode for numba")
    assert child.exitstatus == 0 and "starting:" not in shown, shown
