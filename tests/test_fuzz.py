"""Fuzzing every parser of outside input through the command line, as a standing test.

Property, for every generated input: the command exits 0, or exits 1 (2 when click itself
rejects an option's value) with exactly one `error:` line on stderr — never a traceback, never
an "internal error" — and writes nothing outside the paths it was asked to write.

Parsers and the command that feeds each: safetensors header (`model info`), config.json
(`model info`), tokenizer_config.json and its chat template (`generate`), tokenizer.json
(`generate`), GGUF metadata written
with the real `gguf` writer (`model import`), goldens JSONL (`probe`), PROBE.toml (`probe`),
command-line numbers (`probe`, `generate`), a server's answers (`goldens record --engine URL`,
tests/hostile.py on 127.0.0.1). Inputs are valid files and answers with fields deleted or
replaced by arbitrary JSON/typed values, plus raw bytes; a server also answers with redirects
and error statuses, and must never get the API key sent elsewhere.

Profiles (docs/fuzzing.md): KOLIBRI_FUZZ_EXAMPLES cases per parser, default 25 (seconds, in
the normal test run); the long profile is KOLIBRI_FUZZ_EXAMPLES=10000.
"""

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import COMPILING, TINY_LLAMA_CONFIG, tiny_llama_tensors, write_tiny_tokenizer
from crafted import gguf_fields, golden_line, write_gguf
from hostile import PROPS, HostileServer, completion, json_answer, redirect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.probe.config import FIELDS

EXAMPLES = int(os.environ.get("KOLIBRI_FUZZ_EXAMPLES", "25"))
fuzz = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
DELETE = object()

# ---- values -------------------------------------------------------------------------------

surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc80"])
texts = st.one_of(st.text(max_size=12), surrogates, st.sampled_from(
    ["", "\x1b[2J", "nan", "1e999", "-1", "F32", "BF16", "llama", "gpt2", "default", "../x"]))
numbers = st.one_of(
    st.integers(-3, 300), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e12, -0.0, 1e308]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


def edits(keys: list[str], values=json_values):
    """A few (key, new value or DELETE) edits to a valid dict, sometimes on a new key."""
    return st.lists(st.tuples(st.one_of(st.sampled_from(keys), texts),
                              st.one_of(st.just(DELETE), values)), min_size=1, max_size=4)


def edited(base: dict, changes) -> dict:
    out = dict(base)
    for key, value in changes:
        if value is DELETE:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


# ---- the property -------------------------------------------------------------------------


@contextmanager
def workspace():
    """A fresh folder as working directory and KOLIBRI_HOME (offline)."""
    old_cwd, old_env = Path.cwd(), dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="kolibri-fuzz-") as tmp:
        root = Path(tmp)
        os.chdir(root)
        os.environ.update(KOLIBRI_HOME=str(root / "home"), KOLIBRI_OFFLINE="1")
        os.environ.pop("KOLIBRI_DEBUG", None)
        try:
            yield root
        finally:
            os.chdir(old_cwd)
            os.environ.clear()
            os.environ.update(old_env)


def snapshot(root: Path) -> dict[str, tuple]:
    found = {}
    for dirpath, dirnames, names in os.walk(root):
        for name in names + dirnames:
            path = Path(dirpath) / name
            st_ = path.lstat()
            found[str(path.relative_to(root))] = (st_.st_size, st_.st_mtime_ns, st_.st_mode)
    return found


@contextmanager
def private_tempdir():
    """tempfile's folder, for one command, in a fresh folder of its own: another test worker's
    atomic write in the shared /tmp is not this command's leftover."""
    folder, saved = Path(tempfile.mkdtemp(prefix="kolibri-fuzz-tmp-")), tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved
        leftover = sorted(p.name for p in folder.iterdir())
        shutil.rmtree(folder)
    assert not leftover, f"left a private temporary behind: {leftover}"


def check(root: Path, args: list, allowed: tuple[str, ...] = (), input: bytes | None = None,
          usage_ok: bool = False):
    """Run `kolibri ARGS` in `root`; assert the property; return the result."""
    before = snapshot(root)
    with private_tempdir():
        result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    assert "Traceback" not in result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    codes = (0, 1, 2) if usage_ok else (0, 1)
    assert result.exit_code in codes, (result.exit_code, result.stderr)
    if result.exit_code:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        others = [line for line in result.stderr.splitlines()  # the session's first load compiles
                  if line.strip() and not line.startswith(("error: ", "note: ", COMPILING))]
        assert len(errors) == 1 and others == [], result.stderr
        assert "internal error" not in errors[0], errors[0]
        assert result.stdout == "" or args[0] == "probe", result.stdout  # probe prints, then gates
    after = snapshot(root)
    changed = {p for p in after if before.get(p) != after[p]} | (set(before) - set(after))
    outside = {p for p in changed if not p.startswith(allowed) or not allowed}
    assert not outside, f"wrote outside {allowed}: {sorted(outside)[:5]}"
    return result


# ---- safetensors header: `kolibri model info` ---------------------------------------------


def tiny_folder(root: Path, config: bytes | None = None, weights: bytes | None = None,
                tokenizer_config: bytes | None = None) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(config if config is not None
                                         else dumps(TINY_LLAMA_CONFIG))
    write_tiny_tokenizer(folder)
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_bytes(tokenizer_config)
    if weights is None:
        from safetensors.numpy import save_file

        save_file(tiny_llama_tensors(), str(folder / "model.safetensors"))
    else:
        (folder / "model.safetensors").write_bytes(weights)
    return folder


def _valid_header() -> dict:
    offset, header = 0, {}
    for name, a in tiny_llama_tensors().items():
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    return header


HEADER = _valid_header()
DATA_BYTES = max(v["data_offsets"][1] for v in HEADER.values())
entry_values = st.one_of(json_values, st.lists(numbers, max_size=4),
                         st.sampled_from(["F32", "F16", "BF16", "I32", "F64"]))


@st.composite
def safetensors_files(draw) -> bytes:
    kind = draw(st.sampled_from(["entries", "header", "raw", "length"]))
    if kind == "raw":
        return draw(st.binary(max_size=200))
    header = {name: dict(entry) for name, entry in HEADER.items()}
    if kind == "entries":
        for name in draw(st.lists(st.sampled_from(sorted(header)), min_size=1, max_size=3)):
            header[name] = edited(header[name], draw(edits(["dtype", "shape", "data_offsets"],
                                                           entry_values)))
    else:
        header = edited(header, draw(edits(sorted(header) + ["__metadata__"])))
    head = dumps(header)
    length = len(head) if kind != "length" else draw(st.one_of(
        st.integers(0, len(head) + 64), st.integers(0, 2**64 - 1)))
    data = b"\0" * draw(st.sampled_from([DATA_BYTES, 0, DATA_BYTES - 4, DATA_BYTES + 4]))
    return length.to_bytes(8, "little") + head + data


@fuzz
@given(safetensors_files())
def test_fuzz_safetensors_header(weights):
    with workspace() as root:
        folder = tiny_folder(root, weights=weights)
        check(root, ["model", "info", folder, "--json"])


# ---- config.json: `kolibri model info` ----------------------------------------------------

config_files = st.one_of(
    st.builds(lambda c: dumps(edited(TINY_LLAMA_CONFIG, c)), edits(
        sorted(TINY_LLAMA_CONFIG) + ["head_dim", "rope_scaling", "rope_parameters",
                                     "sliding_window", "layer_types", "hidden_act",
                                     "use_sliding_window", "max_window_layers"])),
    st.builds(dumps, json_values),
    st.binary(max_size=100),
)


@fuzz
@given(config_files)
def test_fuzz_config_json(config):
    with workspace() as root:
        folder = tiny_folder(root, config=config)
        check(root, ["model", "info", folder, "--json"])


# ---- tokenizer_config.json and its chat template: `kolibri generate` ----------------------

JINJA_PIECES = ["{{ ", " }}", "{% for m in messages %}", "{% endfor %}", "{% if ", " %}",
                "{% endif %}", "{% set x = ", "range(", ")", " * ", " ** ", " + ", "'x'",
                "10", "100000", "9", "m['content']", "messages", "bos_token", "loop.index",
                "raise_exception('no')", "|tojson", "|length", "|join(','))", "{% macro f() %}",
                "{{ f() }}", "{% endmacro %}", ".ljust(", ".__class__", "[0]", "{# ", " #}",
                "strftime_now('%Y')", "\n", "x"]
templates = st.one_of(
    st.lists(st.sampled_from(JINJA_PIECES), max_size=14).map("".join),
    texts)
tokenizer_configs = st.one_of(
    st.builds(lambda t, extra: dumps(edited({"chat_template": t, "bos_token": "<|im_start|>",
                                             "eos_token": "<|im_end|>"}, extra)),
              templates, st.lists(st.tuples(st.sampled_from(
                  ["bos_token", "eos_token", "chat_template", "pad_token"]),
                  st.one_of(st.just(DELETE), json_values)), max_size=2)),
    st.builds(dumps, json_values),
    st.binary(max_size=60))


@fuzz
@given(tokenizer_configs, st.sampled_from(["hi", "-"]))
def test_fuzz_tokenizer_config_and_chat_template(tokenizer_config, prompt):
    from kolibri_cli.engine import template

    template.SECONDS, saved = 0.5, template.SECONDS  # a looping template costs 0.5 s, not 5
    try:
        with workspace() as root:
            folder = tiny_folder(root, tokenizer_config=tokenizer_config)
            check(root, ["generate", "--model", folder, "-n", "2", prompt], input=b"stdin text")
    finally:
        template.SECONDS = saved


# ---- tokenizer.json: `kolibri generate --raw` ---------------------------------------------

_TOKENIZER_TYPES = {"normalizer": ["NFC", "NFKC", "Lowercase", "Replace", "Sequence", "Strip"],
                    "pre_tokenizer": ["ByteLevel", "Split", "Digits", "Whitespace", "Metaspace",
                                      "Sequence"],
                    "decoder": ["ByteLevel", "BPEDecoder", "Metaspace", "Sequence", "Fuse"],
                    "post_processor": ["TemplateProcessing", "ByteLevel", "RobertaProcessing"],
                    "model": ["BPE", "WordPiece", "WordLevel", "Unigram"]}


@st.composite
def tokenizer_files(draw) -> bytes:
    """The tiny tokenizer.json with a top-level part, a part's field, a vocab entry, a merge
    or an added token replaced — or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=80))
    tok = json.loads(TOKENIZER_JSON)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "part", "vocab", "merges", "added"]))
        if where == "top":
            tok = edited(tok, draw(edits(sorted(tok))))
        elif where == "part":
            part = draw(st.sampled_from(sorted(_TOKENIZER_TYPES)))
            base = tok.get(part) if isinstance(tok.get(part), dict) else {}
            kind = draw(st.one_of(st.sampled_from(_TOKENIZER_TYPES[part]), texts))
            tok[part] = edited(base | {"type": kind}, draw(st.lists(st.tuples(
                st.one_of(st.sampled_from(sorted(base) or ["type"]), texts),
                st.one_of(st.just(DELETE), json_values)), max_size=3)))
        elif where == "vocab" and isinstance(tok.get("model"), dict):
            vocab = tok["model"].get("vocab")
            if isinstance(vocab, dict):
                vocab[draw(texts)] = draw(st.one_of(numbers, json_values))
        elif where == "merges" and isinstance(tok.get("model"), dict):
            tok["model"]["merges"] = draw(st.lists(st.one_of(texts, json_values), max_size=4))
        elif where == "added":
            tok["added_tokens"] = draw(st.lists(st.one_of(
                st.fixed_dictionaries({"id": numbers, "content": texts, "special": st.booleans()}),
                json_values), max_size=3))
    return dumps(tok)


def _tokenizer_json() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        return (Path(tmp) / "tokenizer.json").read_text()


TOKENIZER_JSON = _tokenizer_json()


@fuzz
@given(tokenizer_files())
def test_fuzz_tokenizer_json(tokenizer):
    with workspace() as root:
        folder = tiny_folder(root)
        (folder / "tokenizer.json").write_bytes(tokenizer)
        check(root, ["generate", "--model", folder, "-n", "3", "--raw", "hello <|im_end|> 12"])


# ---- GGUF metadata (the real gguf writer): `kolibri model import` -------------------------


def _typed_values():
    import gguf

    T = gguf.GGUFValueType
    ints = st.one_of(st.integers(0, 70), st.integers(0, 2**32 - 1))
    return st.one_of(
        st.tuples(st.just(T.UINT32), ints), st.tuples(st.just(T.INT32), st.integers(-5, 70)),
        st.tuples(st.just(T.UINT64), st.integers(0, 2**64 - 1)),
        st.tuples(st.just(T.FLOAT32), st.floats(width=32)),
        st.tuples(st.just(T.BOOL), st.booleans()),
        st.tuples(st.just(T.STRING), st.text(max_size=12)),
        st.builds(lambda v: (T.ARRAY, v, T.STRING), st.lists(st.text(max_size=5), max_size=5)),
        st.builds(lambda v: (T.ARRAY, v, T.INT32), st.lists(st.integers(-3, 300), max_size=5)),
    )


@st.composite
def gguf_edits(draw):
    fields = gguf_fields()
    keys = sorted(fields) + ["llama.vocab_size", "llama.attention.key_length",
                             "llama.rope.dimension_count", "llama.rope.scaling.type",
                             "llama.rope.scaling.factor", "tokenizer.ggml.add_bos_token",
                             "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"]
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3)):
        if draw(st.booleans()):
            fields.pop(key, None)
        else:
            fields[key] = draw(_typed_values())
    return fields


@fuzz
@given(gguf_edits())
def test_fuzz_gguf_metadata(fields):
    with workspace() as root:
        try:
            path = write_gguf(root / "x.gguf", fields)
        except Exception:  # the writer itself refuses (e.g. a value out of its type's range)
            return
        check(root, ["model", "import", path, "--name", "fz"],
              allowed=("home/models/fz", "home/locks", "home/models", "home"))


# ---- goldens JSONL: `kolibri probe` -------------------------------------------------------

GOLDEN = golden_line()
golden_lines = st.one_of(
    st.builds(lambda c: dumps(edited(GOLDEN, c)), edits(sorted(GOLDEN) + ["eos_ids", "sampling"])),
    st.builds(lambda s: dumps(GOLDEN | {"sampling": s}), st.dictionaries(st.sampled_from(
        ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "x"]),
        st.one_of(numbers, json_values), max_size=4)),
    st.builds(dumps, json_values),
    st.binary(max_size=60))


@fuzz
@given(st.lists(golden_lines, min_size=1, max_size=4), st.booleans())
def test_fuzz_goldens_jsonl(lines, markdown):
    with workspace() as root:
        (root / "g.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        extra = ["--markdown", "report.md"] if markdown else ["--json"]
        check(root, ["probe", "--goldens", "g.jsonl", "--by-category", *extra],
              allowed=("report.md",))


# ---- PROBE.toml: `kolibri probe` ----------------------------------------------------------

TOML_KEYS = [*FIELDS, "unknown_key"]
toml_scalars = st.one_of(
    st.integers(-2**63, 2**63 - 1).map(str), st.sampled_from(["nan", "inf", "-inf", "1e999",
                                                              "0.5", "true", "false"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=10).map(json.dumps),
    st.sampled_from(['"g.jsonl"', '"1-4"', '"1,2,3"', '"vllm,suffix"', '"1,1.1"', '"a-b"']),
    st.integers(4000, 5000).map(lambda n: "9" * n))  # around Python's 4,300-digit limit
toml_values = st.one_of(toml_scalars, st.lists(toml_scalars, max_size=3).map(
    lambda xs: "[" + ", ".join(xs) + "]"))


@st.composite
def probe_tomls(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=80))
    lines = ['goldens = "g.jsonl"'] if draw(st.booleans()) else []
    for key in draw(st.lists(st.sampled_from(TOML_KEYS), max_size=5, unique=True)):
        if key in ("markdown", "plot"):  # written paths: only ones inside the workspace
            value = draw(st.sampled_from(['"out.md"', '"out.png"', '"sub/out.md"']))
        else:
            value = draw(toml_values)
        lines.append(f"{key} = {value}")
    return ("\n".join(lines) + "\n").encode()


@fuzz
@given(probe_tomls())
def test_fuzz_probe_toml(toml):
    with workspace() as root:
        (root / "g.jsonl").write_bytes(dumps(GOLDEN) + b"\n")
        (root / "p.toml").write_bytes(toml)
        check(root, ["probe", "p.toml"], allowed=("out.md", "out.png", "sub"))


# ---- command-line numbers: `kolibri probe` and `kolibri generate` -------------------------

number_texts = st.one_of(
    st.text(alphabet="0123456789-.,e+ ", max_size=12),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "NaN", "9" * 30, "9" * 5000, "²", "١",
                     "0x10", "1_000", "", " ", "1-", "-1", "1-4-5", "4-1", "1e3", "1,,2"]),
    st.integers(-5, 2**70).map(str), st.floats().map(repr))
SAMPLING_OPTIONS = ["--temperature", "--top-k", "--top-p", "--min-p", "--repetition-penalty",
                    "--seed"]
PROBE_OPTIONS = ["--k", "--window", "--costs", "--min-ratio", "--min-acceptance", "--limit",
                 "--max-tokens", *SAMPLING_OPTIONS]
GENERATE_OPTIONS = ["--k", "--window", "--max-tokens", "--threads", *SAMPLING_OPTIONS]


@fuzz
@given(st.lists(st.tuples(st.sampled_from(PROBE_OPTIONS), number_texts), min_size=1,
                max_size=4))
def test_fuzz_probe_numbers(options):
    with workspace() as root:
        (root / "g.jsonl").write_bytes(dumps(GOLDEN) + b"\n")
        args = [a for pair in options for a in pair]
        check(root, ["probe", "--goldens", "g.jsonl", "--json", *args], usage_ok=True)


@fuzz
@given(st.lists(st.tuples(st.sampled_from(GENERATE_OPTIONS), number_texts), min_size=1,
                max_size=3), st.sampled_from(["vllm", "adaptive", "suffix", "hf",
                                              "llamacpp-simple"]))
def test_fuzz_generate_numbers(options, proposer):
    with workspace() as root:
        args = [a for pair in options for a in pair]
        check(root, ["generate", "--spec", "--proposer", proposer, "--model", "missing-model",
                     *args, "hi"], usage_ok=True)


# ---- a server's answers: `kolibri goldens record --engine URL` -----------------------------

LLAMA = completion([5, 6, 7], {"predicted_ms": 9.5, "predicted_n": 3, "draft_n": 2,
                               "draft_n_accepted": 1})
TEXT = {"choices": [{"text": "abc", "token_ids": [5, 6, 7], "finish_reason": "length"}],
        "timings": {"predicted_ms": 9.5}}
ROUTES = {"llama.cpp": ("POST", "/completion"), "vllm": ("POST", "/v1/completions"),
          "openai": ("POST", "/v1/completions")}
OTHER_STATUS = [301, 302, 303, 307, 308, 400, 401, 403, 404, 418]  # (busy ones: retried, slow)


def _nested_edit(base: dict, key: str, changes) -> dict:
    inner = base.get(key)
    inner = inner[0] if isinstance(inner, list) else inner
    edited_inner = edited(inner, changes)
    return base | {key: [edited_inner] if isinstance(base[key], list) else edited_inner}


@st.composite
def server_answers(draw):
    """(api, status, body) as a server might answer a completion: the valid answer with a field
    (top level, timings, a probability entry or choice) deleted or replaced, any JSON, bytes, or
    another status (a redirect goes to the catcher)."""
    api = draw(st.sampled_from(sorted(ROUTES)))
    base = LLAMA if api == "llama.cpp" else TEXT
    inner = "timings" if api == "llama.cpp" else "choices"
    kind = draw(st.integers(0, 9))
    if kind < 4:
        body = dumps(edited(base, draw(edits(sorted(base)))))
    elif kind < 7:
        keys = sorted(base[inner] if isinstance(base[inner], dict) else base[inner][0])
        body = dumps(_nested_edit(base, inner, draw(edits(keys, st.one_of(numbers,
                                                                          json_values)))))
    elif kind == 7:
        body = dumps(draw(json_values))
    else:
        body = draw(st.binary(max_size=60))
    status = 200 if draw(st.integers(0, 4)) else draw(st.sampled_from(OTHER_STATUS))
    return api, status, body


@pytest.fixture(scope="module")
def hostile():
    catcher, engine = HostileServer(), HostileServer()
    yield engine, catcher
    engine.close()
    catcher.close()


@fuzz
@given(answer=server_answers(), props=st.one_of(st.just(PROPS), json_values))
def test_fuzz_server_answers(hostile, answer, props):
    engine, catcher = hostile
    api, status, body = answer
    reply = redirect(status, f"{catcher.url}/x") if 300 <= status < 400 else \
        json_answer(body, status)
    engine.routes = {ROUTES[api]: reply, ("GET", "/props"): json_answer(props),
                     ("GET", "/v1/models"): json_answer({"data": [{"id": "m"}]}),
                     ("GET", "/version"): json_answer({"version": "1"})}
    with workspace() as root:
        os.environ["KOLIBRI_API_KEY"] = "sk-fuzz"
        folder = tiny_folder(root)
        (root / "p.txt").write_text("hello\n")
        check(root, ["goldens", "record", "--engine", engine.url, "--engine-api", api, "-m",
                     folder, "-p", "p.txt", "-o", "out.jsonl", "-n", "4", "--timeout", "10"],
              allowed=("out.jsonl", "home"))
        if (root / "out.jsonl").exists():  # what was written, the probe reads back
            check(root, ["probe", "--goldens", "out.jsonl", "--json"])
    assert catcher.requests == []


@pytest.mark.parametrize("seed", [b"", b"\xff\xfe", b"{}", b"[]"])
def test_fuzz_seeds_run(seed):
    """The property checker itself fails on a bad outcome (so the fuzzers can find one)."""
    with workspace() as root:
        (root / "g.jsonl").write_bytes(seed)
        result = check(root, ["probe", "--goldens", "g.jsonl"])
        assert result.exit_code == 1
