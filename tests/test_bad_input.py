"""Crafted input from outside — files, arguments, stdin, a closed stdout — through the command
line: each is exit 0 or one `error:` line with exit 1 (2 for an option click itself cannot
parse), never a traceback, and the line names what was wrong."""

import json
import os
import subprocess
import sys

import pytest
from conftest import COMPILING, TINY_LLAMA_CONFIG, tiny_llama_tensors, write_tiny_tokenizer
from crafted import (
    gguf_fields,
    gguf_tensors,
    golden_line,
    write_gguf,
    write_goldens,
    write_raw_safetensors,
)
from typer.testing import CliRunner

from kolibri_cli.cli import app


@pytest.fixture
def run(kolibri_home, monkeypatch):
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")

    def invoke(*args, input=None):
        return CliRunner().invoke(app, [str(a) for a in args], input=input)

    return invoke




def one_error_line(result, *fragments: str, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines()
             if not line.startswith(COMPILING)]  # the first model loaded in a session compiles
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "internal error" not in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---- safetensors headers ----

GOOD = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
HEADERS = {
    "negative shape": {"x": GOOD | {"shape": [-2, -3]}},
    "float shape": {"x": GOOD | {"shape": [2.0, 3.0]}},
    "string shape": {"x": GOOD | {"shape": "2x3"}},
    "string in shape": {"x": GOOD | {"shape": ["2", 3]}},
    "absurd shape": {"x": GOOD | {"shape": [10**30, 10**30]}},
    "nested shape": {"x": GOOD | {"shape": [[2], [3]]}},
    "negative offsets": {"x": GOOD | {"data_offsets": [-24, 0]}},
    "float offsets": {"x": GOOD | {"data_offsets": [0.0, 24.0]}},
    "string offsets": {"x": GOOD | {"data_offsets": "0-24"}},
    "absurd offsets": {"x": GOOD | {"data_offsets": [0, 10**30]}},
    "reversed offsets": {"x": GOOD | {"data_offsets": [24, 0]}},
    "dtype list": {"x": GOOD | {"dtype": ["F32"]}},
    "entry a list": {"x": [1, 2, 3]},
}


def crafted_folder(tmp_path, header=None, raw: bytes | None = None, config=None):
    folder = tmp_path / "crafted"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG) if config is None
                                        else config if isinstance(config, str)
                                        else json.dumps(config))
    write_tiny_tokenizer(folder)
    if raw is not None:
        (folder / "model.safetensors").write_bytes(raw)
    elif header is not None:
        write_raw_safetensors(folder / "model.safetensors", header, b"\0" * 24)
    else:
        from safetensors.numpy import save_file

        save_file(tiny_llama_tensors(), str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("case", list(HEADERS))
@pytest.mark.parametrize("command", ["info", "generate"])
def test_crafted_safetensors_headers(run, tmp_path, case, command):
    folder = crafted_folder(tmp_path, HEADERS[case])
    args = ("model", "info", folder) if command == "info" else ("generate", "--model", folder, "hi")
    one_error_line(run(*args), "model.safetensors")


@pytest.mark.parametrize("raw", [
    pytest.param(lambda: b"[" * 100_000 + b"]" * 100_000, id="deeply nested"),
    pytest.param(lambda: b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], '
                         b'"data_offsets": [0, 4]}}', id="5000-digit number"),
    pytest.param(lambda: b'{"x": ' * 50_000 + b"1" + b"}" * 50_000, id="nested objects"),
])
@pytest.mark.parametrize("command", ["info", "generate"])
def test_unparseable_safetensors_headers(run, tmp_path, raw, command):
    head = raw()
    folder = crafted_folder(tmp_path, raw=len(head).to_bytes(8, "little") + head)
    args = ("model", "info", folder) if command == "info" else ("generate", "--model", folder, "hi")
    one_error_line(run(*args), "not a safetensors file")


# ---- config.json ----

CONFIGS = {
    "architectures nested": ({"architectures": [["x"]]}, "architectures must be a list"),
    "architectures object": ({"architectures": {"a": 1}}, "architectures must be a list"),
    "context 1e12": ({"max_position_embeddings": 1e12}, "max_position_embeddings"),
    "context 0": ({"max_position_embeddings": 0},
                  "max_position_embeddings (the context length) must be in 1.."),
    "context negative": ({"max_position_embeddings": -5}, "max_position_embeddings"),
    "context text": ({"max_position_embeddings": "big"}, "max_position_embeddings"),
    "context 2.5": ({"max_position_embeddings": 2.5}, "max_position_embeddings"),
    "layers 1e9": ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    "heads 0": ({"num_attention_heads": 0}, "num_attention_heads"),
    "heads true": ({"num_attention_heads": True}, "num_attention_heads"),
    "vocab null": ({"vocab_size": None}, "vocab_size"),
    "eos nested": ({"eos_token_id": [[2]]}, "eos_token_id"),
    "eos text": ({"eos_token_id": "2"}, "eos_token_id"),
    "hidden_act list": ({"hidden_act": ["silu"]}, "hidden_act"),
    "rope_scaling list": ({"rope_scaling": [1, 2]}, "wrong type"),
    "rope factor text": ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "wrong type"),
    "rope factor inf": ({"rope_scaling": {"rope_type": "linear", "factor": 1e999}},
                        "finite number"),
    "rope type list": ({"rope_scaling": {"rope_type": ["yarn"]}}, "rope type"),
    "theta negative": ({"rope_theta": -1.0}, "rope_theta"),
    "sliding window text": ({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                             "sliding_window": "wide"}, "wrong type"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
@pytest.mark.parametrize("command", ["info", "generate"])
def test_crafted_config_json(run, tmp_path, case, command):
    changes, fragment = CONFIGS[case]
    folder = crafted_folder(tmp_path, config=TINY_LLAMA_CONFIG | changes)
    args = ("model", "info", folder) if command == "info" else ("generate", "--model", folder, "hi")
    one_error_line(run(*args), "config.json", fragment)


@pytest.mark.parametrize("text", [
    '{"vocab_size": NaN}', "[" * 100_000, '{"vocab_size": ' + "9" * 5000 + "}", "\ufeff{}",
    '{"a": "\\ud800"}', "null",
])
def test_config_json_that_is_no_config(run, tmp_path, text):
    folder = crafted_folder(tmp_path, config=text)
    one_error_line(run("model", "info", folder), "config.json")


# ---- chat templates ----

TEMPLATES = {
    "range 10**9": ("{% for i in range(10**9) %}x{% endfor %}", "Range too big"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", "ran longer than"),
    "10 GB string": ("{{ 'x' * 10**10 }}", "more than 256 MB of memory"),
    "10 GB padding": ("{{ 'x'.ljust(10**10) }}", "more than 256 MB of memory"),
    "huge power": ("{{ 7 ** (10 ** 9) }}", "too large"),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
    "flood": ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
              "more than 16777216 characters"),
    "escape attempt": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "lone surrogate": ("{{ '\\ud800' }}", "invalid text"),
    "no parse": ("{% for %}", "does not parse"),
}


@pytest.mark.parametrize("case", list(TEMPLATES))
def test_hostile_chat_templates_cost_seconds_and_one_line(run, tmp_path, monkeypatch, case):
    from kolibri_cli.engine import template

    monkeypatch.setattr(template, "SECONDS", 1.0)
    source, fragment = TEMPLATES[case]
    folder = crafted_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    one_error_line(run("generate", "--model", folder, "-n", "2", "hi"), "chat template", fragment)


def test_chat_template_files_that_cannot_be_read(run, tmp_path):
    folder = crafted_folder(tmp_path)
    (folder / "chat_template.jinja").write_bytes(b"{{ messages \xff }}")
    one_error_line(run("generate", "--model", folder, "hi"), "chat_template.jinja", "UTF-8")
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": [1, {"name": []}]}))
    result = run("generate", "--model", folder, "-n", "2", "hi")  # no usable "default": raw
    assert result.exit_code == 0 and result.exception is None


# ---- GGUF metadata (written with the gguf library's own writer) ----

def _gguf_cases():
    import gguf

    T = gguf.GGUFValueType
    n_tokens = len(gguf_fields()["tokenizer.ggml.tokens"][1])
    return {
        "head_count 0": ({"llama.attention.head_count": (T.UINT32, 0)}, "head_count must be >= 1"),
        "head_count text": ({"llama.attention.head_count": (T.STRING, "four")},
                            "head_count must be a whole number"),
        "head_count float": ({"llama.attention.head_count": (T.FLOAT32, 4.0)},
                             "head_count must be a whole number"),
        "bos out of range": ({"tokenizer.ggml.bos_token_id": (T.UINT32, n_tokens + 5)},
                             "outside the vocabulary"),
        "eos out of range": ({"tokenizer.ggml.eos_token_id": (T.UINT32, 10**9)},
                             "outside the vocabulary"),
        "no merges": ({"tokenizer.ggml.merges": None}, "lacks tokenizer.ggml.merges"),
        "bad merge": ({"tokenizer.ggml.merges": (T.ARRAY, ["h e", "nospace"], T.STRING)},
                      "merges holds"),
        "merge of unknown tokens": ({"tokenizer.ggml.merges": (T.ARRAY, ["Q Z"], T.STRING)},
                                    "tokenizer cannot be built"),
        "short token_type": ({"tokenizer.ggml.token_type": (T.ARRAY, [1, 1, 1], T.INT32)},
                             "one whole-number type per token"),
        "tokens not strings": ({"tokenizer.ggml.tokens": (T.ARRAY, [1, 2, 3], T.INT32)},
                               "tokenizer.ggml.tokens"),
        "no tokens": ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        "architecture number": ({"general.architecture": (T.UINT32, 7)}, "not supported"),
        "context 4e9": ({"llama.context_length": (T.UINT64, 4 * 10**9)},
                        "max_position_embeddings"),
        "rope base nan": ({"llama.rope.freq_base": (T.FLOAT32, float("nan"))}, "freq_base"),
        "eps negative": ({"llama.attention.layer_norm_rms_epsilon": (T.FLOAT32, -1.0)},
                         "layer_norm_rms_epsilon"),
        "template number": ({"tokenizer.chat_template": (T.UINT32, 5)}, "chat_template"),
        "pre-tokenizer list": ({"tokenizer.ggml.pre": (T.ARRAY, ["smollm"], T.STRING)},
                               "tokenizer.ggml.pre"),
        "layers 0": ({"llama.block_count": (T.UINT32, 0)}, "block_count must be >= 1"),
        "heads not dividing": ({"llama.attention.head_count_kv": (T.UINT32, 3)},
                               "not a multiple"),
    }


GGUF_CASES = list(_gguf_cases())


@pytest.mark.parametrize("case", GGUF_CASES)
def test_crafted_gguf_metadata(run, tmp_path, kolibri_home, case):
    changes, fragment = _gguf_cases()[case]
    fields = gguf_fields()
    for key, value in changes.items():
        if value is None:
            fields.pop(key)
        else:
            fields[key] = value
    path = write_gguf(tmp_path / "x.gguf", fields)
    one_error_line(run("model", "import", path, "--name", "x"), fragment)
    assert not (kolibri_home / "models").exists() or not any(
        (kolibri_home / "models").iterdir())


TOKENIZER_CASES = [case for case, (changes, _) in _gguf_cases().items()
                   if all(key.startswith("tokenizer.") for key in changes)]


def _traces(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"},
                                             {"role": "assistant", "content": "hi"}]}) + "\n")
    return path


@pytest.mark.parametrize("case", TOKENIZER_CASES)
def test_crafted_gguf_metadata_read_as_a_tokenizer(run, tmp_path, kolibri_home, case):
    """Where kolibri only tokenizes, a GGUF is read for its metadata: the same refusals."""
    changes, fragment = _gguf_cases()[case]
    fields = gguf_fields()
    for key, value in changes.items():
        if value is None:
            fields.pop(key)
        else:
            fields[key] = value
    path = write_gguf(tmp_path / "x.gguf", fields)
    one_error_line(run("goldens", "import", _traces(tmp_path), "-o", tmp_path / "g.jsonl", "-m",
                       path), "x.gguf", fragment)
    assert not (kolibri_home / "models").exists() and not (tmp_path / "g.jsonl").exists()


def _kv_type_offset(data: bytes) -> int:
    """Where the first metadata value's type (u32) is: after the 24-byte header and the key."""
    import struct

    return 24 + 8 + struct.unpack_from("<Q", data, 24)[0]


@pytest.mark.parametrize("damage", ["empty", "3 bytes", "cut in the header", "cut in a key",
                                    "cut in the vocabulary", "version 1", "value type 99",
                                    "string array of 2^60"])
def test_a_damaged_gguf_read_as_a_tokenizer_is_one_line(run, tmp_path, kolibri_home, damage):
    import struct

    data = bytearray(write_gguf(tmp_path / "good.gguf").read_bytes())
    at = _kv_type_offset(data)
    fragment = "truncated GGUF metadata"
    if damage == "empty":
        data, fragment = b"", "not a GGUF file"
    elif damage == "3 bytes":
        data, fragment = data[:3], "not a GGUF file"
    elif damage == "cut in the header":
        data = data[:20]
    elif damage == "cut in a key":
        data = data[:at - 2]
    elif damage == "cut in the vocabulary":
        data = data[:data.find(b"<|im_end|>") + 4]
    elif damage == "version 1":
        data[4:8], fragment = struct.pack("<I", 1), "GGUF version 1 is not supported"
    elif damage == "value type 99":
        data[at:at + 4], fragment = struct.pack("<I", 99), "value of unknown type 99"
    else:  # the tokens array claims 2^60 strings: refused by the vocabulary's limit
        tokens = data.find(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8
        data[tokens:tokens + 8] = struct.pack("<Q", 1 << 60)
        fragment = "(at most 4,194,304)"
    path = tmp_path / "x.gguf"
    path.write_bytes(bytes(data))
    one_error_line(run("goldens", "import", _traces(tmp_path), "-o", tmp_path / "g.jsonl", "-m",
                       path), "x.gguf", fragment)


@pytest.mark.parametrize("case", ["missing tensor", "wrong shape", "extra tensor"])
def test_import_refuses_a_gguf_that_could_never_load(run, tmp_path, kolibri_home, case):
    import numpy as np

    tensors = gguf_tensors()
    if case == "missing tensor":
        del tensors["blk.0.ffn_down.weight"]
        fragment = "missing tensors model.layers.0.mlp.down_proj.weight"
    elif case == "wrong shape":
        tensors["blk.0.ffn_up.weight"] = np.zeros((8, 8), np.float32)
        fragment = "model.layers.0.mlp.up_proj.weight has shape (8, 8)"
    else:
        tensors["blk.5.attn_q.weight"] = np.zeros((32, 32), np.float32)
        fragment = "unexpected tensors model.layers.5.self_attn.q_proj.weight"
    one_error_line(run("model", "import", write_gguf(tmp_path / "x.gguf", tensors=tensors),
                       "--name", "x"), "x.gguf", fragment)
    assert not (kolibri_home / "models").exists() or not any(
        (kolibri_home / "models").iterdir())


@pytest.mark.parametrize("name", ["", "x" * 300, "*", ".."])
def test_import_names(run, tmp_path, name):
    one_error_line(run("model", "import", write_gguf(tmp_path / "x.gguf"), "--name", name),
                   "invalid model name")


# ---- goldens ----

def test_golden_token_ids_must_be_int32(run, tmp_path):
    for ids in ([1, 10**30], [1, 1e30]):  # orjson reads a 100-bit integer as a float: 1e+30
        path = write_goldens(tmp_path / "g.jsonl", golden_line(output_ids=ids))
        line = one_error_line(run("probe", "--goldens", path), "g.jsonl:1", "output_ids",
                              "token ids must be integers in 0..2147483647")
        assert "1e+30" in line or "1000000000000000000000000000000" in line, line
    path = write_goldens(tmp_path / "g.jsonl", golden_line(id=1e30))
    one_error_line(run("probe", "--goldens", path), "'id' must be a string or an integer")


@pytest.mark.parametrize("field", ["id", "category", "prompt"])
def test_lone_surrogates_in_goldens(run, tmp_path, field):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(golden_line(**{field: "a\ud800b"})) + "\n")
    for extra in ((), ("--markdown", tmp_path / "r.md"), ("--json",)):
        one_error_line(run("probe", "--goldens", path, *extra), "g.jsonl:1", field,
                       "lone surrogate")


def test_escape_sequences_in_goldens_never_reach_the_terminal(run, tmp_path):
    evil = "\x1b]0;pwned\x07\x1b[2J"
    path = write_goldens(tmp_path / "g.jsonl", golden_line(id=f"x{evil}", category=f"c{evil}"))
    report = tmp_path / "r.md"
    result = run("probe", "--goldens", path, "--by-category", "--markdown", report)
    assert result.exit_code == 0, result.output
    for text in (result.stdout, report.read_text()):
        assert "\x1b" not in text and "\x07" not in text
        assert "\\x1b" in text and "\\x07" in text  # shown escaped (a table may fold it)
    assert "x\\x1b]0;pwned\\x07" in report.read_text()
    dup = write_goldens(tmp_path / "d.jsonl", golden_line(id=evil), golden_line(id=evil))
    assert "\\x1b" in one_error_line(run("probe", "--goldens", dup), "duplicate golden id")


def test_markdown_cells_keep_their_table(run, tmp_path):
    path = write_goldens(tmp_path / "g.jsonl", golden_line(id="a|b\nc", category="x|y"))
    report = tmp_path / "r.md"
    assert run("probe", "--goldens", path, "--markdown", report).exit_code == 0
    row = next(line for line in report.read_text().splitlines() if line.startswith("| a\\|"))
    assert row.startswith("| a\\|b\\nc (x\\|y) |") and row.count(" | ") == 8  # + speedup


def test_probe_toml_that_is_not_utf8(run, tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_bytes(b"k = 5\nwindow = \"1-4\xff\"\n")
    one_error_line(run("probe", toml), "p.toml", "not UTF-8")
    toml.write_text("k = " + "[" * 10_000 + "]" * 10_000 + "\n")
    one_error_line(run("probe", toml), "p.toml")
    toml.write_text("k = " + "9" * 5000 + "\n")  # past Python's int conversion limit
    one_error_line(run("probe", toml), "p.toml", "an integer of 4,300+ digits")


# ---- numbers ----

@pytest.mark.parametrize("args, fragment", [
    (("--min-ratio", "nan"), "min_ratio must be a finite number"),
    (("--min-ratio", "inf"), "min_ratio must be a finite number"),
    (("--min-acceptance", "nan"), "min_acceptance must be a finite number"),
    (("--costs", "nan,inf"), "costs must be finite positive numbers"),
    (("--costs", "1,1e999"), "costs must be finite positive numbers"),
    (("--k", "100000000"), "k must be a whole number in 1..1024"),
    (("--k", "9" * 5000), "k must be a whole number in 1..1024"),
    (("--window", "1-1000000000"), "1 <= MIN <= MAX <= 1024"),
    (("--window", "1-²"), "is invalid"),
    (("--limit", "1e3"), "--limit"),
    (("--temperature", "nan"), "temperature must be a finite number"),  # found by fuzzing
    (("--top-p", "inf"), "top_p must be a finite number"),
])
def test_probe_numbers(run, tmp_path, args, fragment):
    path = write_goldens(tmp_path / "g.jsonl")
    code = 2 if args[0] == "--limit" else 1
    one_error_line(run("probe", "--goldens", path, *args), fragment, code=code)


@pytest.mark.parametrize("line, fragment", [
    ("min_ratio = nan", "min_ratio must be a finite number"),
    ("min_acceptance = inf", "min_acceptance must be a finite number"),
    ("costs = [1.0, nan]", "costs must be finite positive numbers"),
    ("limit = inf", "limit must be a whole number"),
    ("k = 1e9", "k must be a whole number"),
    ("repetition_penalty = nan", "repetition_penalty must be a finite number"),
    # integers past float's range (math.isfinite and float() raised OverflowError)
    (f"min_ratio = {'9' * 400}", "min_ratio must be a finite number >= 0"),
    (f"min_speedup = {'9' * 4200}", "min_speedup must be a finite number >= 0"),
    (f"temperature = {'9' * 400}", "temperature must be a finite number"),
    (f"timeout = {'9' * 400}", "timeout must be a number of seconds in"),
    (f"concurrency = {'9' * 400}", "concurrency"),
])
def test_probe_toml_numbers(run, tmp_path, line, fragment):
    toml = tmp_path / "p.toml"
    toml.write_text(f'goldens = "g.jsonl"\n{line}\n')
    write_goldens(tmp_path / "g.jsonl")
    one_error_line(run("probe", toml), fragment)


@pytest.mark.parametrize("args, fragment", [
    (("--spec", "--window", "1-999999999"), "1 <= MIN <= MAX <= 1024"),
    (("--spec", "--proposer", "adaptive", "--k", "10000000000"), "k must be a whole number"),
    (("--spec", "--k", "1000"), "--k 1000 does not fit the model's context (256 tokens"),
    (("--spec", "--window", "300"), "--window max 300 exceeds the model's context (256"),
])
def test_generate_bounds(run, tiny_llama_folder, args, fragment):
    one_error_line(run("generate", "--model", tiny_llama_folder(), *args, "hi"), fragment)


def test_bench_and_probe_measure_bounds(run, tiny_llama_folder, tmp_path):
    folder = tiny_llama_folder()
    one_error_line(run("bench", "--model", folder, "--k", "500"), "does not fit the model's")
    goldens = write_goldens(tmp_path / "g.jsonl")
    one_error_line(run("probe", "--goldens", goldens, "--measure", "--model", folder,
                       "--allow-model-mismatch", "--window", "1-600"), "exceeds the model's")


def test_json_output_is_strict(run, tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))

    path = write_goldens(tmp_path / "g.jsonl")
    result = run("probe", "--goldens", path, "--costs", "1,1.1,1.2", "--json")
    assert result.exit_code == 0
    strict(result.stdout)
    from kolibri_cli.cli.options import print_json

    with pytest.raises(ValueError):
        print_json({"x": float("nan")})


# ---- prompts ----

def test_invalid_utf8_prompts_fail_before_loading(run):
    """The model does not exist: the prompt error must come first (nothing loads)."""
    one_error_line(run("generate", "--model", "/nonexistent", "-", input=b"x\xff"),
                   "stdin is not valid UTF-8", "byte 0xff at offset 1")
    one_error_line(run("generate", "--model", "/nonexistent", "ab\udcfe"),
                   "not valid UTF-8", "byte 0xfe at character 2")


def test_invalid_utf8_prompt_as_a_real_argument(tmp_path):
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path), "KOLIBRI_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "generate", b"x\xffy"],
                          capture_output=True, env=env)
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr == b"error: the prompt is not valid UTF-8 (byte 0xff at character 1); " \
                          b"pass UTF-8 text\n"


# ---- the standard streams ----

def _closed_stdout(args, tmp_path):
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path / "home"), "KOLIBRI_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "kolibri_cli", *map(str, args)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env, preexec_fn=lambda: os.close(1), cwd=tmp_path)


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("model", "list", "--json"),
                                  ("probe", "--goldens", "g.jsonl"),
                                  ("probe", "--goldens", "g.jsonl", "--json")])
def test_closed_stdout_is_an_error_not_silence(tmp_path, args):
    write_goldens(tmp_path / "g.jsonl")
    proc = _closed_stdout(args, tmp_path)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: cannot write the output: stdout is closed"], proc.stderr
    assert "Traceback" not in proc.stderr


def test_closed_stdout_never_lands_in_a_file_we_open(tmp_path):
    """fd 1 closed: the next file opened would get fd 1, and our output would go into it."""
    write_goldens(tmp_path / "g.jsonl")
    proc = _closed_stdout(("probe", "--goldens", "g.jsonl", "--markdown", "r.md"), tmp_path)
    assert proc.returncode == 1
    assert (tmp_path / "r.md").read_text().startswith("# kolibri probe")
    assert "per golden" not in (tmp_path / "r.md").read_text()


def _with_stdout_reader_gone(args, tmp_path, stdin: bytes = b"") -> tuple[int, str]:
    """Run kolibri with a stdout pipe whose reader closed it before the first write: every
    write kolibri makes there meets a broken pipe."""
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path / "home"), "KOLIBRI_OFFLINE": "1"}
    env.pop("KOLIBRI_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "kolibri_cli", *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    _, err = proc.communicate(stdin, timeout=600)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("args", [("model", "list", "--json"), ("--help",),
                                  ("model", "list", "--help")])
def test_a_reader_that_goes_away_is_a_quiet_exit_0(tmp_path, args):
    """`kolibri ... | head -n 2`: the broken pipe is the reader's choice — exit 0, as `head`
    expects, no message (and never an 'internal error')."""
    assert _with_stdout_reader_gone(args, tmp_path) == (0, "")


def test_generate_into_a_pipe_its_reader_closed_exits_0_quietly(tiny_llama_folder, tmp_path):
    """`printf '1\\n2\\n3\\n' | kolibri generate --raw -n 400 - | head -n 2`: exit 0, and
    stderr holds only generate's own notes (no error, no 'Exception ignored' at exit)."""
    args = ("generate", "--model", tiny_llama_folder(), "--raw", "-n", "400", "-")
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path / "home"), "KOLIBRI_OFFLINE": "1"}
    whole = subprocess.run([sys.executable, "-m", "kolibri_cli", *map(str, args)],
                           input=b"1\n2\n3\n", capture_output=True, env=env, timeout=600)
    assert whole.returncode == 0 and len(whole.stdout) > 10, whole.stderr  # it does write
    code, err = _with_stdout_reader_gone(args, tmp_path, stdin=b"1\n2\n3\n")
    lines = [line for line in err.splitlines() if not line.startswith(COMPILING)]
    assert code == 0, err
    assert all(line.startswith("note:") for line in lines), err


# ---- found beyond the audit ----

def test_an_index_naming_files_outside_the_folder_is_refused(run, tmp_path):
    outside = tmp_path / "secret.safetensors"
    write_raw_safetensors(outside, {})
    folder = crafted_folder(tmp_path)
    for shard in ("../secret.safetensors", str(outside), 7, ""):
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.norm.weight": shard}}))
        one_error_line(run("model", "info", folder), "is not a file name in the folder")


def test_a_fifo_among_the_weights_is_refused_not_read_forever(run, tmp_path):
    folder = crafted_folder(tmp_path)
    os.mkfifo(folder / "extra.safetensors")
    one_error_line(run("model", "info", folder), "extra.safetensors: not a regular file")


def test_model_import_of_a_fifo_is_refused_not_waited_on(tmp_path):
    """`model import` of a FIFO blocked in open() for ever (a GGUF is memory-mapped: only a
    regular file will do). A subprocess, so the old hang fails the test instead of the run."""
    os.mkfifo(tmp_path / "x.gguf")
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path / "home"), "KOLIBRI_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "model", "import",
                           str(tmp_path / "x.gguf"), "--name", "x"], capture_output=True, env=env,
                          timeout=120)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and lines == [
        f"error: {tmp_path / 'x.gguf'}: not a regular file, expected a GGUF file"], lines
    assert not (tmp_path / "home" / "models").exists()


@pytest.mark.parametrize("option", ["goldens", "probe config", "prompts"])
def test_devices_that_never_end_are_refused_as_input(run, tmp_path, option):
    """/dev/zero as a goldens file, a PROBE.toml or a prompt file was read until memory ran out."""
    if option == "goldens":
        args = ("probe", "--goldens", "/dev/zero")
    elif option == "probe config":
        args = ("probe", "/dev/zero")
    else:
        args = ("goldens", "record", "--prompts", "/dev/zero", "-o", tmp_path / "o.jsonl")
    one_error_line(run(*args), "/dev/zero: is a device or socket")


def test_a_fifo_in_a_goldens_folder_is_skipped_not_read_for_ever(run, tmp_path):
    (tmp_path / "goldens").mkdir()
    write_goldens(tmp_path / "goldens" / "g.jsonl")
    os.mkfifo(tmp_path / "goldens" / "stuck.jsonl")
    result = run("probe", "--goldens", tmp_path / "goldens", "--json")
    assert result.exit_code == 0, result.output
    assert [g["id"] for g in json.loads(result.stdout)["runs"][0]["goldens"]] == ["g1"]


def test_empty_names_never_mean_the_default(run, tmp_path):
    """An unset variable in `--model "$MODEL"` or `--goldens "$G"` must not silently pick the
    default model or every *.jsonl under the working directory."""
    one_error_line(run("generate", "--model", "", "hi"), "model name is empty")
    one_error_line(run("model", "info", ""), "model name is empty")
    one_error_line(run("probe", "--goldens", ""), "goldens: an empty path")
    toml = tmp_path / "p.toml"
    toml.write_text('goldens = ""\n')
    one_error_line(run("probe", toml), "goldens: an empty path")


def test_a_files_record_naming_paths_outside_the_folder_is_damage(run, tmp_path):
    name, folder = __import__("kolibri_cli.store.cache", fromlist=["x"]).import_gguf(
        write_gguf(tmp_path / "t.gguf"), "t")
    meta = json.loads((folder / "kolibri.json").read_text())
    for bad in ("/etc/hostname", "../../t.gguf", "a/../../b"):
        meta["files"] = {bad: {"bytes": 1, "sha256": "0" * 64}}
        (folder / "kolibri.json").write_text(json.dumps(meta))
        one_error_line(run("model", "verify", "t"), "kolibri.json of t is damaged")
        one_error_line(run("generate", "--model", "t", "hi"), "kolibri.json of t is damaged")


def test_a_panicking_tokenizer_is_one_line(run, tmp_path, monkeypatch):
    """The tokenizers library's Rust panics arrive as pyo3's PanicException, a BaseException
    that `except Exception` does not catch."""
    import tokenizers

    class PanicException(BaseException):  # what pyo3 raises; not importable by name
        pass

    def panics(*args, **kwargs):
        raise PanicException("called `Option::unwrap()` on a `None` value")

    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", panics)
    one_error_line(run("model", "info", crafted_folder(tmp_path)), "tokenizer.json: cannot be read",
                   "unwrap")


def test_chat_survives_a_line_that_is_not_utf8(tmp_path):
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path), "KOLIBRI_OFFLINE": "1"}
    folder = crafted_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "chat", "--model",
                           str(folder), "-n", "2"], input=b"x\xff\nhello\n",
                          capture_output=True, env=env, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "error: that line is not valid UTF-8" in err and "type it again" in err
    assert "new tokens" in err  # the next line was answered


def test_chat_with_stdin_closed_ends_quietly(tmp_path):
    """`kolibri chat <&-` (no stdin at all) is an empty session, not an internal error."""
    env = os.environ | {"KOLIBRI_HOME": str(tmp_path), "KOLIBRI_OFFLINE": "1"}
    folder = crafted_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "chat", "--model", str(folder),
                           "-n", "2"], stdin=None, capture_output=True, env=env, timeout=300,
                          preexec_fn=lambda: os.close(0))
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "error" not in err, err
    assert "kolibri chat with" in err


def test_goldens_that_do_not_fit_the_model_name_the_file_and_golden(run, tiny_llama_folder,
                                                                    tmp_path):
    """Ids outside the vocabulary (a SIGSEGV in goldens check once) or a chain longer than the
    context: one line naming file:line and the golden, before any decoding."""
    folder = tiny_llama_folder()  # vocabulary 1000, context 256
    for line, fragment in ((golden_line(id="far", prompt_ids=[1, 60000]),
                            "prompt_ids[1] = 60000 is outside the vocabulary"),
                           (golden_line(id="long", output_ids=[1, 2] * 200),
                            "take 405 positions, more than the context")):
        path = write_goldens(tmp_path / "g.jsonl", golden_line(), line)
        for args in (("goldens", "check", path), ("probe", "--goldens", path, "--measure")):
            one_error_line(run(*args, "--model", folder, "--allow-model-mismatch"),
                           "g.jsonl:2", f"golden '{line['id']}'", fragment)


# ---- internal errors that were left: each one line ----


def test_a_long_costs_list_is_read_as_a_list_not_a_file_name(run):
    """~60 numbers (a c(T) curve, the documented form) passed the longest file name: "internal
    error (OSError: File name too long)"."""
    costs = ",".join(f"1.{i:03d}" for i in range(60))
    result = run("probe", "--costs", costs, "--json")
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["config"]["costs"]) == 60


@pytest.mark.parametrize("key", ["concurrency", "proposer", "k", "window", "costs", "goldens"])
def test_an_empty_list_in_probe_toml_is_refused_by_name(run, tmp_path, key):
    """`concurrency = []` was "internal error (ValueError: max() arg is an empty sequence)";
    `proposer = []` silently meant the default."""
    toml = tmp_path / "PROBE.toml"
    toml.write_text(f"{key} = []\n")
    one_error_line(run("probe", toml), f"{key} = []", "leave")


def test_a_tokenizer_panic_is_one_line_without_rust_text(tmp_path, tiny_llama_folder):
    """A pre-tokenizer regex that backtracks makes the tokenizers library panic: its Rust text
    (and backtrace) went to stderr before kolibri's error line."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    folder = tiny_llama_folder()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("(a+)+$"), "isolated"), tok.pre_tokenizer])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    traces = tmp_path / "t.jsonl"
    traces.write_text(json.dumps({"messages": [{"role": "user", "content": "a" * 40 + "b"},
                                               {"role": "assistant", "content": "hi"}]}) + "\n")
    out = subprocess.run([sys.executable, "-m", "kolibri_cli", "goldens", "import", str(traces),
                          "-o", str(tmp_path / "g.jsonl"), "-m", str(folder)],
                         capture_output=True, text=True, timeout=300,
                         env=os.environ | {"KOLIBRI_HOME": str(tmp_path / "home"),
                                           "RUST_BACKTRACE": "1"})
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: ") and "retry-limit" in lines[0], lines[0]


# ---- limits on the work asked for ----


def test_a_sweep_of_too_many_settings_is_refused_before_it_runs(run):
    """100 k values x 820 windows printed nothing and grew 10 MB/s until stopped."""
    ks = ",".join(str(k) for k in range(1, 101))
    windows = ",".join(f"{lo}-{hi}" for lo in range(1, 11) for hi in range(lo, lo + 5))
    one_error_line(run("probe", "--k", ks, "--window", windows), "5,000 settings", "4,096")


def test_workers_are_capped_at_the_cores(monkeypatch):
    """`--workers 48` started 49 processes (6.7 GB) on a machine of 2 cores: at most one worker
    per core, said in a note."""
    from kolibri_cli.probe import run as probe_run
    from kolibri_cli.probe import workers
    from kolibri_cli.probe.config import ProbeConfig
    from kolibri_cli.probe.replay.shards import PARALLEL_MIN_BYTES

    class Task:
        nbytes = PARALLEL_MIN_BYTES

    monkeypatch.setattr(workers, "cores", lambda: 2)
    notes = []
    executor = probe_run.executor_for(ProbeConfig(workers=48), [Task()] * 48, notes.append)
    assert executor.workers == 2
    assert len(notes) == 1 and "--workers 48" in notes[0] and "at most 2" in notes[0]


# ---- small checks ----


def test_golden_ids_1_and_string_1_are_one_id(run, tmp_path):
    """Ids 1 and "1" in one file gave two rows named 1."""
    # compiled first: a first replay's progress bar leaves a blank line before an error
    assert run("probe", "--goldens", write_goldens(tmp_path / "ok.jsonl")).exit_code == 0
    path = write_goldens(tmp_path / "g.jsonl", golden_line(id=1), golden_line(id="1"))
    one_error_line(run("probe", "--goldens", path), "duplicate golden id")


def test_a_goldens_file_of_two_models_is_refused(run, tmp_path):
    """The probe prices a file by its first golden's model: a second model's goldens in it were
    priced as the first's without a word."""
    path = write_goldens(tmp_path / "g.jsonl", golden_line(id="a"),
                         golden_line(id="b", model="other", model_sha256="1" * 64))
    one_error_line(run("probe", "--goldens", path, "--json"), "g.jsonl:2", "'other'",
                   "a file of their own")


def _chat_folder(tiny_llama_folder):
    folder = tiny_llama_folder()
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return folder


@pytest.mark.parametrize("max_tokens", [-5, 1e30, 0, "8", True])
def test_a_traces_max_tokens_out_of_range_is_refused(run, tmp_path, tiny_llama_folder,
                                                     max_tokens):
    """-5 and 1e30 were written into the golden's reference."""
    traces = tmp_path / "t.jsonl"
    traces.write_text(json.dumps({
        "request": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
        "response": {"choices": [{"message": {"content": "yo"}, "finish_reason": "stop"}]}})
        + "\n")
    one_error_line(run("goldens", "import", traces, "-o", tmp_path / "g.jsonl", "-m",
                       _chat_folder(tiny_llama_folder)), "t.jsonl:1", "max_tokens")
    assert not (tmp_path / "g.jsonl").exists()


def test_a_lone_surrogate_in_a_trace_is_refused_without_suggesting_raw(run, tmp_path,
                                                                       tiny_llama_folder):
    """The message said "use --raw", which goldens import lacks."""
    traces = tmp_path / "t.jsonl"
    traces.write_text('{"messages": [{"role": "user", "content": "a\\ud800"}, '
                      '{"role": "assistant", "content": "b"}]}\n')
    line = one_error_line(run("goldens", "import", traces, "-o", tmp_path / "g.jsonl", "-m",
                              _chat_folder(tiny_llama_folder)), "t.jsonl:1", "lone surrogate")
    assert "--raw" not in line
