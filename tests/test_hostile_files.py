"""Crafted golden and trace files: nesting 100,000 deep, a 5,000-digit integer, fake and truncated
compression, compression bombs. Each is one `error:` line (exit 1) naming the limit, and the
limits can be raised; a bomb costs no memory (peak RSS measured in a child process against a
normal probe's)."""

import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

import pytest
from conftest import COMPILING
from crafted import golden_line, write_goldens
from typer.testing import CliRunner

from kolibri_cli.cli import app

MB = 1 << 20


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    monkeypatch.delenv("KOLIBRI_DEBUG", raising=False)
    for var in ("KOLIBRI_MAX_LINE_MB", "KOLIBRI_MAX_EXPANSION"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def one_error(result) -> str:
    assert "Traceback" not in result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not line.startswith(COMPILING)]
    assert result.exit_code == 1 and len(lines) == 1, (result.exit_code, result.stderr)
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], lines[0]
    return lines[0]


def probe(path):
    return CliRunner().invoke(app, ["probe", "--goldens", str(path), "--json"])


def gzip_members(path, text: bytes, times: int):
    """`text` repeated `times` times as concatenated gzip members: a bomb of len(text) * times
    bytes written in milliseconds (gzip reads the members as one stream)."""
    member = gzip.compress(text, 9)
    with open(path, "wb") as f:
        for _ in range(times):
            f.write(member)
    return path


NESTED = b'{"id": "g", "reference": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
HUGE_INT = json.dumps(golden_line()).replace('"prompt_ids": [1,', '"prompt_ids": [' + "9" * 5000
                                             + ",").encode() + b"\n"


@pytest.mark.parametrize("name, data, expected", [
    ("nested.jsonl", NESTED, "nested ~1,000 levels deep"),
    ("int.jsonl", HUGE_INT, "a number of more than 4,300 digits"),
    ("nested.jsonl.gz", gzip.compress(NESTED), "nested ~1,000 levels deep"),
    ("fake.jsonl.gz", b"\x1f\x8b" + b"not gzip at all" * 10, "corrupt or truncated compressed"),
    ("cut.jsonl.gz", gzip.compress(json.dumps(golden_line()).encode() * 50)[:-30],
     "corrupt or truncated compressed"),
    ("flipped.jsonl.gz", (lambda b: b[:20] + b"\x00\xff" * 8 + b[36:])(
        gzip.compress(json.dumps(golden_line()).encode() * 50)), "compressed"),
    ("temperature.jsonl", json.dumps(golden_line(sampling={"temperature": 10**400})).encode()
     + b"\n", "temperature must be a finite number, got an integer past a float's range"),
])
def test_crafted_golden_files_are_one_line(env, name, data, expected):
    (env / name).write_bytes(data)
    line = one_error(probe(env / name))
    assert expected in line and name in line, line


def test_corrupt_zstd_is_one_line(env):
    zstd = pytest.importorskip("zstandard")
    good = zstd.ZstdCompressor().compress(json.dumps(golden_line()).encode() * 50)
    (env / "cut.jsonl.zst").write_bytes(good[:-10])
    (env / "fake.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"garbage" * 20)
    for name in ("cut.jsonl.zst", "fake.jsonl.zst"):
        assert "zstd" in one_error(probe(env / name))


def test_a_newline_bomb_stops_at_the_expansion_limit(env):
    path = gzip_members(env / "newlines.jsonl.gz", b"\n" * (16 * MB), 64)  # 1 GiB
    line = one_error(probe(path))
    assert re.search(r"passes 19\d MB, more than 200x the compressed file", line), line
    assert "KOLIBRI_MAX_EXPANSION" in line


def test_blank_lines_under_the_limit_cost_no_python_each(env):
    """60 MB of blank lines around one golden read in well under the test's patience (each
    line in Python took ~1 s per million)."""
    path = env / "g.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b"\n" * (56 * MB))
        f.write(json.dumps(golden_line()).encode() + b"\n")
        f.write(b"  \r\n" * MB)
    result = probe(path)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["throughput"]["chains"] == 1


def test_the_line_limit_names_itself_and_can_be_raised(env, monkeypatch):
    path = write_goldens(env / "long.jsonl", golden_line(prompt="x" * (3 * MB // 2)))
    monkeypatch.setenv("KOLIBRI_MAX_LINE_MB", "1")
    line = one_error(probe(path))
    assert "long.jsonl:1: the line is longer than 1 MB" in line and "KOLIBRI_MAX_LINE_MB" in line
    monkeypatch.setenv("KOLIBRI_MAX_LINE_MB", "2")
    assert probe(path).exit_code == 0
    monkeypatch.setenv("KOLIBRI_MAX_LINE_MB", "lots")
    assert "KOLIBRI_MAX_LINE_MB='lots': expected a whole number > 0" in one_error(probe(path))


def test_the_expansion_limit_can_be_raised(env, monkeypatch):
    path = env / "g.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps(golden_line()).encode() + b"\n"))
    with open(path, "ab") as f:
        f.write(gzip.compress(b"\n" * (16 * MB), 9) * 5)  # 80 MB of text in 80 KB
    assert "passes 64 MB" in one_error(probe(path))
    monkeypatch.setenv("KOLIBRI_MAX_EXPANSION", "2000")
    assert probe(path).exit_code == 0


@pytest.mark.parametrize("line, expected", [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested ~1,000 levels deep"),
    (b'{"id": ' + b"7" * 5000 + b', "messages": []}', "a number of more than 4,300 digits"),
])
def test_crafted_traces_are_one_line(env, tiny_llama_folder, line, expected):
    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (env / "t.jsonl").write_bytes(line + b"\n")
    result = CliRunner().invoke(app, ["goldens", "import", str(env / "t.jsonl"), "-o",
                                      str(env / "out.jsonl"), "-m", str(folder)])
    assert expected in one_error(result)
    assert not (env / "out.jsonl").exists()


# ---- peak memory of a bomb: in a child process, against a normal probe ------------------------


def _peak_mb(args: list[str], home) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS in MB) of `kolibri ARGS` in a child (its own rusage)."""
    env = dict(os.environ, KOLIBRI_HOME=str(home), KOLIBRI_OFFLINE="1")
    env.pop("KOLIBRI_DEBUG", None)
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "kolibri_cli", *args],
                             stdout=subprocess.DEVNULL, stderr=err, env=env)
        killer = threading.Timer(300, p.kill)
        killer.start()
        _, status, usage = os.wait4(p.pid, 0)
        killer.cancel()
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read().decode(), usage.ru_maxrss / 1024


def test_a_bomb_costs_no_memory(env):
    """1 GiB of spaces in 1 MB of gzip (one endless line): one line, peak RSS within 200 MB of
    a normal probe's."""
    normal = write_goldens(env / "g.jsonl")
    bomb = gzip_members(env / "bomb.jsonl.gz", b" " * (16 * MB), 64)
    code, err, normal_mb = _peak_mb(["probe", "--goldens", str(normal), "--json"], env / "home")
    assert code == 0, err
    code, err, bomb_mb = _peak_mb(["probe", "--goldens", str(bomb), "--json"], env / "home")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "longer than 64 MB" in lines[0], err
    assert bomb_mb < normal_mb + 200, (bomb_mb, normal_mb)


def test_a_million_id_chain_is_simulated_in_little_memory(env):
    """One golden of 1M output ids (the shipped outputs over and over, 1% of ids random): exit 0
    with vllm, hf and llamacpp-simple (each replay linear in the chain, tests/test_fast_paths.py
    pins its counts), peak RSS within 200 MB of a normal probe's."""
    import random

    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens

    rng = random.Random(0)
    shipped = [t for g in load_goldens(DEFAULT_CHAT) for t in g.output_ids]
    ids = [rng.randrange(49152) if rng.random() < 0.01 else t
           for t in (shipped * (1_000_000 // len(shipped) + 1))[:1_000_000]]
    normal = write_goldens(env / "g.jsonl")
    long = write_goldens(env / "long.jsonl", golden_line(output_ids=ids))
    code, err, normal_mb = _peak_mb(["probe", "--goldens", str(normal), "--json"], env / "home")
    assert code == 0, err
    code, err, long_mb = _peak_mb(["probe", "--goldens", str(long), "--proposer",
                                   "vllm,hf,llamacpp-simple", "--json"], env / "home")
    assert code == 0, err
    assert long_mb < normal_mb + 200, (long_mb, normal_mb)


# ---- readers bounded: regular files only, counts against the bytes present ------------------


def _run_cli(args: list[str], env_home, timeout: float = 120) -> subprocess.CompletedProcess:
    """kolibri in a child process: a reader that waits on a FIFO fails the test by its timeout
    instead of hanging the session."""
    return subprocess.run([sys.executable, "-m", "kolibri_cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"KOLIBRI_HOME": str(env_home),
                                            "KOLIBRI_OFFLINE": "1"})


def _one_line(out: subprocess.CompletedProcess, *fragments: str) -> str:
    lines = [line for line in out.stderr.splitlines()
             if line.strip() and not line.startswith(COMPILING)]
    assert out.returncode == 1 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    assert lines[0].startswith("error: ") and "internal error" not in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "too big"])
def test_an_ngram_cache_that_is_not_a_regular_file_is_one_line(env, kind):
    """`--lookup-cache-static /dev/zero` grew to 24 GB; a FIFO there waited for ever; a sparse
    3 GB file was read whole."""
    goldens = write_goldens(env / "g.jsonl")
    path, fragment = {"fifo": (env / "fifo", "is a FIFO"),
                      "device": ("/dev/zero", "is a device"),
                      "folder": (env, "is a folder"),
                      "too big": (env / "big.bin", "more than a n-gram cache may hold")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "too big":
        with open(path, "wb") as f:
            f.truncate(3 << 30)  # sparse: no disk
    out = _run_cli(["probe", "--goldens", goldens, "--proposer", "llamacpp-cache",
                    "--lookup-cache-static", path], env / "home", timeout=60)
    _one_line(out, str(path), fragment)


def _gguf_claiming(path, key: bytes, count: int, apparent: int):
    """A GGUF header with one metadata array of `count` empty strings under `key`, the file
    sparse to `apparent` bytes (its zeros read as empty strings): 4 KB on disk."""
    import struct

    head = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<IIQ", 9, 8, count))
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(apparent)
    return path


@pytest.mark.parametrize("command", ["model import", "goldens import"])
def test_a_gguf_claiming_a_huge_vocabulary_is_one_line(env, command):
    """10^8 empty strings in a sparse file (every one present as 8 zero bytes) took 6.9 GB over
    200 s in `model import`: no vocabulary is larger than 4M tokens."""
    path = _gguf_claiming(env / "x.gguf", b"tokenizer.ggml.tokens", 10**8, 8 * 10**8 + 4096)
    args = (["model", "import", path, "--name", "x"] if command == "model import" else
            ["goldens", "import", _traces(env), "-o", env / "out.jsonl", "-m", path])
    _one_line(_run_cli(args, env / "home"), "x.gguf", "100,000,000 entries", "4,194,304")


def test_a_gguf_count_past_its_bytes_is_one_line(env):
    """A count its file cannot hold is refused before the gguf library builds anything."""
    path = _gguf_claiming(env / "x.gguf", b"general.some_array", 10**7, 4096)
    _one_line(_run_cli(["model", "import", path, "--name", "x"], env / "home"), "x.gguf",
              "10,000,000 entries", "remaining bytes")


def test_a_gguf_of_arrays_nested_deep_is_one_line(env):
    """Arrays of arrays 100,000 deep (12 bytes a level) overflowed the header walk's stack: the
    line named Python's recursion limit. Real models nest none."""
    import struct

    nest = struct.pack("<IQ", 9, 1) * 100_000
    path = env / "x.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"x.y"
                     + struct.pack("<I", 9) + nest + struct.pack("<IQ", 4, 1) + b"\0" * 8)
    _one_line(_run_cli(["model", "import", path, "--name", "x"], env / "home"), "x.gguf",
              "x.y nests arrays more than 4 deep")


def _traces(folder):
    path = folder / "traces.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"},
                                             {"role": "assistant", "content": "hi"}]}) + "\n")
    return path


def test_a_large_trace_file_is_read_a_block_at_a_time(env, tiny_llama_folder):
    """`goldens import` read a trace file whole (a 1 GB sparse file: 2.24 GB RSS): now a block at
    a time, and its one endless line stops at the line limit, in a small peak."""
    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    traces = _traces(env)
    code, err, normal_mb = _peak_mb(["goldens", "import", str(traces), "-o",
                                     str(env / "a.jsonl"), "-m", str(folder)], env / "home")
    assert code == 0, err
    with open(env / "big.jsonl", "wb") as f:
        f.truncate(1 << 30)
    code, err, big_mb = _peak_mb(["goldens", "import", str(env / "big.jsonl"), "-o",
                                  str(env / "b.jsonl"), "-m", str(folder)], env / "home")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "longer than 64 MB" in lines[0], err
    assert big_mb < normal_mb + 200, (big_mb, normal_mb)
