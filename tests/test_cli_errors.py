"""The command line's one error boundary against what a hostile user or environment does: a file
it may not read, SIGTERM mid-write, options with no explanation in --help."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COMPILING
from crafted import TEMPLATE

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


# ---- goldens record / import: the output is never the input, every golden replays ----

def _run(*args):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, [str(a) for a in args])


def _one_error(result, fragment: str) -> None:
    lines = _stderr_lines(result.stderr)
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines


@pytest.mark.parametrize("command", ["record", "import"])
def test_goldens_output_may_not_be_its_input(kolibri_home, tiny_llama_folder, tmp_path, command):
    source = tmp_path / "in.jsonl"
    text = ('{"id": "a", "category": "c", "prompt": "hello"}\n' if command == "record" else
            '{"messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "hello"}]}\n')
    source.write_text(text)
    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    if command == "record":
        args = ("goldens", "record", "--engine", "kolibri", "-m", folder, "-p", source)
    else:
        args = ("goldens", "import", source, "-m", folder)
    _one_error(_run(*args, "-o", tmp_path / "." / "in.jsonl"), "is the")
    assert source.read_text() == text


def test_goldens_record_fits_every_chain_in_the_context(kolibri_home, tiny_llama_folder,
                                                         tmp_path):
    from conftest import TINY_LLAMA_CONFIG

    from kolibri_cli.goldens.chains import load_goldens

    context = TINY_LLAMA_CONFIG["max_position_embeddings"]
    prompts, out = tmp_path / "p.txt", tmp_path / "g.jsonl"
    record = ("goldens", "record", "--engine", "kolibri", "-m", tiny_llama_folder(), "--raw",
              "-p", prompts, "-o", out, "-n", context)
    prompts.write_text("abcd\n" + "x" * (context - 10) + "\n")  # byte-level: 1 token a byte
    result = _run(*record)
    assert result.exit_code == 0, result.output
    assert "capped by the context" in result.stderr
    goldens = load_goldens(out)
    assert [len(g.prompt_ids) + len(g.output_ids) for g in goldens] == [context, context]
    prompts.write_text("abcd\n" + "x" * (context + 5) + "\n")
    _one_error(_run(*record), f"prompt 2 is {context + 5} tokens")
    assert load_goldens(out) == goldens  # refused before any run: the old file stands


# ---- --help explains every option and argument ----

def _leaf_commands(command, path):
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield " ".join(path), command
        return
    for name, sub in subcommands.items():
        yield from _leaf_commands(sub, [*path, name])


def test_help_explains_every_option_and_argument():
    import typer

    unexplained = [f"{path} {param.name}"
                   for path, command in _leaf_commands(typer.main.get_command(app), ["kolibri"])
                   for param in command.params
                   if param.name != "help" and not (getattr(param, "help", None) or "").strip()]
    assert unexplained == []


# ---- sampling options: the message names the option and the value given ----

@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["bench"]])
@pytest.mark.parametrize("option, value", [
    ("--temperature", "nan"), ("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "2"),
    ("--min-p", "-0.5"), ("--repetition-penalty", "inf"), ("--seed", str(2**64)),
])
def test_bad_sampling_options_name_the_option(kolibri_home, command, option, value):
    result = _run(*command, option, value)
    _one_error(result, f"{option} must be")
    assert "Sampling(" not in result.stderr  # was the whole settings object


# ---- an output path that can never be written fails before the work, not after it ----

def test_probe_refuses_an_unwritable_report_before_simulating(kolibri_home, tmp_path):
    from crafted import write_goldens

    goldens = write_goldens(tmp_path / "g.jsonl")
    (tmp_path / "a-file").write_text("x")
    rows = tmp_path / "rows.jsonl"
    result = _run("probe", "-g", goldens, "--rows", rows,
                  "--markdown", tmp_path / "a-file" / "r.md")
    _one_error(result, "cannot write")
    assert not rows.exists()  # the run did not happen (it wrote the rows, then failed)


def test_goldens_record_refuses_an_unwritable_output_before_loading(kolibri_home, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    (tmp_path / "a-file").write_text("x")
    result = _run("goldens", "record", "-m", "no-such-model", "-p", prompts,
                  "-o", tmp_path / "a-file" / "g.jsonl")
    _one_error(result, "cannot write")  # not the model's error: the output is checked first


@pytest.mark.parametrize("under", ["", "sub"])
@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_a_kolibri_home_that_is_a_file_is_named_not_listed_as_empty(tmp_path, monkeypatch, under,
                                                                    as_json):
    home = tmp_path / "a-file"
    home.write_text("x")
    monkeypatch.setenv("KOLIBRI_HOME", str(home / under))
    monkeypatch.delenv("KOLIBRI_DEBUG", raising=False)
    _one_error(_run("model", "list", *as_json), f"{home} is a file")


# ---- a server timeout a socket cannot hold ----

@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_timeouts_a_socket_cannot_hold_are_refused(kolibri_home, tiny_llama_folder, tmp_path,
                                                   monkeypatch, value):
    from crafted import write_goldens

    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    folder = tiny_llama_folder()
    result = _run("bench", "-m", folder, "--engine", "http://127.0.0.1:1",
                  "--timeout", value)  # was an internal error (OverflowError) from the socket
    lines = _stderr_lines(result.stderr)
    assert result.exit_code == 2 and len(lines) == 1 and "--timeout" in lines[0], result.stderr
    _one_error(_run("probe", "-g", write_goldens(tmp_path / "g.jsonl"), "--measure", "-m", folder,
                    "--allow-model-mismatch", "--engine", "http://127.0.0.1:1",
                    "--baseline", "http://127.0.0.1:2", "--timeout", value), "timeout must be")


def test_the_timeout_options_bound_is_the_transports():
    import typer

    from kolibri_cli.engines.transport import MAX_TIMEOUT

    bounds = [getattr(param, "max", None) or getattr(param.type, "max", None)  # typer 0.29, 0.28
              for _, command in _leaf_commands(typer.main.get_command(app), ["kolibri"])
              for param in command.params if param.name == "timeout"]
    assert set(bounds) - {None} == {MAX_TIMEOUT}  # None: probe's, checked in its config


# ---- --json on every command that reports (chat is a conversation, not a report; serve's
# stdout is its access log, JSON lines already) ----

def test_every_reporting_command_has_json():
    import typer

    without = [path for path, command in _leaf_commands(typer.main.get_command(app), ["kolibri"])
               if path not in ("kolibri chat", "kolibri serve")
               and not any("--json" in getattr(p, "opts", []) for p in command.params)]
    assert without == []


def test_writing_commands_report_as_json(kolibri_home, tiny_llama_folder, tmp_path, monkeypatch):
    from crafted import write_gguf

    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    imported = _run("model", "import", write_gguf(tmp_path / "t.gguf"), "--name", "t", "--json")
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout) == {"name": "t", "path": str(kolibri_home / "models" / "t")}
    folder = tiny_llama_folder()  # its kernels compile once a session (the GGUF's blocks: again)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    out = tmp_path / "g.jsonl"
    recorded = _run("goldens", "record", "--engine", "kolibri", "-m", folder, "-p", prompts,
                    "-o", out, "-n", 2, "--json")
    assert recorded.exit_code == 0, recorded.output
    assert json.loads(recorded.stdout) == {
        "output": str(out), "goldens": 1, "capped": 0, "model": str(folder), "engine": "kolibri"}
    traces = tmp_path / "t.jsonl"
    traces.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                      '{"role": "assistant", "content": "hello"}]}\n')
    result = _run("goldens", "import", traces, "-m", folder, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"output": str(out), "goldens": 1, "model": str(folder),
                                         "sampled": 0, "unseeded": 0, "no_temperature": 0,
                                         "served_elsewhere": []}


# ---- options that would do nothing are named on stderr, not silently dropped ----

@pytest.mark.parametrize("args, error", [
    (["generate", "hi", "--k", "3"], "--k needs --spec or --compare"),
    (["generate", "hi", "--window", "2-3", "--proposer", "vllm"],
     "--window, --proposer need --spec or --compare"),
    (["generate", "hi", "--proposer", "guard"], "--proposer needs --spec or --compare"),
    (["bench", "--peer-gguf", "x.gguf"], "--peer-gguf needs --peer"),
    (["bench", "--peer-bin", "x", "--peer-gguf", "x.gguf"], "--peer-bin, --peer-gguf need --peer"),
    (["bench", "--timeout", "5"], "--timeout needs --engine (--engine llama-server or a "
     "server's URL)"),
    (["bench", "--gguf", "x.gguf"], "--gguf needs --engine"),
    (["bench", "--engine", "llama-server", "--prefill", "64", "--temperature", "0.5"],
     "--temperature, --prefill do not apply with --engine: it times a server's c(n)"),
    (["bench", "--engine", "http://127.0.0.1:9", "--threads", "2"],
     "--threads needs --engine llama-server"),
    (["bench", "--engine", "llama-server", "--engine-api", "vllm"],
     "--engine-api needs --engine URL"),
    (["probe", "--repeats", "3"], "--repeats needs --measure"),
    (["probe", "--seed", "3", "--allow-model-mismatch"],
     "--allow-model-mismatch, --seed need --measure"),
    (["probe", "--model", "x"], "--model needs --measure, --bench or --costs measure"),
    (["probe", "--measure", "--timeout", "5"], "--timeout needs --measure on a server"),
    (["probe", "--measure", "--engine", "llama-server", "--engine-api", "vllm"],
     "--engine-api needs --engine URL"),
])
def test_options_that_would_do_nothing_are_refused(kolibri_home, args, error):
    """Before any model loads or any simulation runs: one line, exit 1."""
    _one_error(_run(*args), error)


def test_a_greedy_seed_is_a_note(kolibri_home, tiny_llama_folder):
    result = _run("generate", "-m", tiny_llama_folder(), "hi", "-n", 2, "--seed", "5")
    assert result.exit_code == 0, result.output
    assert "note: --seed has no effect: decoding is greedy" in result.stderr


def test_generate_notes_nothing_when_every_option_is_used(kolibri_home, tiny_llama_folder):
    result = _run("generate", "-m", tiny_llama_folder(), "hi", "-n", 2, "--spec", "--k", 3,
                  "--temperature", 1, "--seed", 5)
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


# ---- one new token: prefill made it, there is no decode speed to divide by ----

def test_compare_of_a_single_token_has_no_ratio_not_a_crash(kolibri_home, tiny_llama_folder):
    folder = tiny_llama_folder()
    result = _run("generate", "-m", folder, "hi", "-n", 1, "--compare", "--json")
    assert result.exit_code == 0, result.output  # was ZeroDivisionError, an internal error
    doc = json.loads(result.stdout)
    assert doc["speedup"] is None
    assert doc["plain"]["stats"]["decode_tokens_per_s"] is None  # was 0.0, a measured-looking zero
    result = _run("generate", "-m", folder, "hi", "-n", 1, "--compare")
    assert result.exit_code == 0, result.output
    assert "spec / plain decode speed: n/a" in result.stderr and "0.0 tok/s" not in result.stderr


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_probe_category_that_names_nothing_is_refused(kolibri_home, tmp_path, value):
    from crafted import write_goldens

    _one_error(_run("probe", "-g", write_goldens(tmp_path / "g.jsonl"), "--category", value),
               "names no category")  # it chose every golden


@pytest.mark.parametrize("option", ["--markdown", "--rows"])
def test_probe_never_writes_over_its_goldens(kolibri_home, tmp_path, option):
    from crafted import write_goldens

    goldens = write_goldens(tmp_path / "g.jsonl")
    text = goldens.read_text()
    _one_error(_run("probe", "-g", goldens, option, tmp_path / "." / "g.jsonl"), "is an input")
    assert goldens.read_text() == text  # the report had replaced the goldens


def test_probe_refuses_one_file_for_two_outputs(kolibri_home, tmp_path):
    from crafted import write_goldens

    out = tmp_path / "out"
    _one_error(_run("probe", "-g", write_goldens(tmp_path / "g.jsonl"), "--rows", out,
                    "--markdown", out), "name the same file")


def test_a_reader_that_goes_away_from_dev_stdout_is_a_quiet_exit(tmp_path):
    """`--rows /dev/stdout | head -c1` is the reader's choice, as on stdout itself: exit 0 and no
    error line (it was 'error: cannot write /dev/stdout: Broken pipe')."""
    from crafted import write_goldens

    goldens = write_goldens(tmp_path / "g.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "kolibri_cli", "probe", "-g", str(goldens),
                             "--rows", "/dev/stdout"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_kolibri_env(tmp_path / "home"))
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and "error:" not in err and "Traceback" not in err, err


def test_goldens_record_refuses_server_options_an_in_process_engine_ignores(
        kolibri_home, tiny_llama_folder, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = _run("goldens", "record", "--engine", "kolibri", "-m", tiny_llama_folder(),
                  "-p", prompts, "-o", tmp_path / "g.jsonl", "-n", 2, "--gguf", tmp_path / "x.gguf",
                  "--served-model", "x")
    _one_error(result, "--gguf, --served-model need a server engine (--engine llama-server or "
                       "a URL)")
    assert not (tmp_path / "g.jsonl").exists()


@pytest.mark.parametrize("value, traceback", [("1", True), ("true", True), ("on", True),
                                              ("0", False), ("", False)])
def test_kolibri_debug_reads_yes_words(kolibri_home, monkeypatch, value, traceback):
    from kolibri_cli.errors import KolibriError

    monkeypatch.setenv("KOLIBRI_DEBUG", value)
    result = _run("generate", "hi", "-n", 0)
    assert isinstance(result.exception, KolibriError) is traceback, result.exception
