"""Probing a deployment without its weights: a folder of tokenizer files, a GGUF read for its
metadata only (a 40 GB one, written sparse, whose tensors are never read), and a server's own
tokenizer (small fake vLLM and SGLang servers here; the real llama-server in
test_llama_server.py). Each gives the full model's ids on the shipped prompts, drives `goldens
import`, `goldens record --engine URL` and `probe --measure --engine URL` without adding weights to
the cache, and identifies the goldens it makes (docs/goldens.md: identity)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from fake_servers import llamacpp, openai_only, prompt_ms, vllm
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.engine.model import Identity, TokenizerOnly
from kolibri_cli.engine.tokenizer import Tokenizer
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import CHAT_PROMPTS, DEFAULT_CHAT, load_goldens
from kolibri_cli.goldens.record import check_model_matches
from kolibri_cli.store.models import open_tokenizer
from kolibri_cli.store.vocabulary import gguf_tokenizer, read_metadata

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.model

PROMPTS = CHAT_PROMPTS
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json",
                   "generation_config.json")
BIG = 40 * 10**9  # bytes of tensor data in the synthetic deployment GGUF


@pytest.fixture(scope="module")
def shipped():
    """The shipped chat goldens: their prompt ids are the full model's."""
    return {g.id: g for g in load_goldens(DEFAULT_CHAT)}


@pytest.fixture
def tokenizer_folder(pulled_default, tmp_path) -> Path:
    """The default model's tokenizer files, without its weights."""
    folder = tmp_path / "smollm2-tokenizer"
    folder.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(pulled_default.path / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def big_gguf(pulled_default, tmp_path_factory) -> Path:
    """A 40 GB deployment GGUF with the default model's tokenizer; its tensor data a hole."""
    from kolibri_cli.store.synthetic import write_sparse

    path = tmp_path_factory.mktemp("deployment") / "llama-70b-like.Q4_0.gguf"
    write_sparse(path, pulled_default.gguf, BIG)
    last = gguf.GGUFReader(str(path)).tensors[-1]  # the library takes it for a whole GGUF
    assert last.data_offset + last.n_bytes == path.stat().st_size > BIG
    assert os.stat(path).st_blocks * 512 < 10**8  # and it takes no disk
    return path


def cli(home: Path):
    def run(*args):
        env = {"KOLIBRI_HOME": str(home), "KOLIBRI_OFFLINE": "1"}
        return CliRunner().invoke(app, [str(a) for a in args], env=env)
    return run


def traces_of(goldens: dict, tmp_path: Path) -> Path:
    """Logged traffic: each shipped prompt as a user message, with an answer."""
    lines = [{"id": g.id, "category": g.category, "messages": [
        {"role": "user", "content": g.prompt},
        {"role": "assistant", "content": f"An answer to {g.id}."}]} for g in goldens.values()]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def cached_models(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


# ---- the tokenizer sources give the full model's ids ---------------------------------------


def test_gguf_metadata_equals_the_gguf_librarys_reading(pulled_default):
    ours = read_metadata(pulled_default.gguf).fields
    theirs = gguf.GGUFReader(str(pulled_default.gguf)).fields
    assert list(ours) == [k for k in theirs if not k.startswith("GGUF.")]
    for key, f in ours.items():
        assert f.value == theirs[key].contents(), key


def test_every_source_gives_the_full_models_ids_on_the_shipped_prompts(
        pulled_default, tokenizer_folder, big_gguf, shipped):
    from kolibri_cli.engines import connect, server_model

    full = Tokenizer(pulled_default.path)
    server = vllm(full)
    try:
        sources = {"folder": open_tokenizer(str(tokenizer_folder)),
                   "gguf": open_tokenizer(str(pulled_default.gguf)),
                   "40 GB gguf": open_tokenizer(str(big_gguf)),
                   "server": server_model(connect(server.url))}
        for name, model in sources.items():
            assert isinstance(model, TokenizerOnly), name
            for g in shipped.values():
                assert model.tokenizer.encode_prompt(g.prompt, chat=True) == g.prompt_ids, \
                    (name, g.id)
            assert model.eos_ids == (2,), name
    finally:
        server.close()


def test_each_source_is_identified_without_weights(pulled_default, tokenizer_folder, big_gguf):
    folder, small, big = (open_tokenizer(str(p)) for p in
                          (tokenizer_folder, pulled_default.gguf, big_gguf))
    from kolibri_cli.engine.loader import sha256_files

    files = [tokenizer_folder / n for n in ("tokenizer.json", "tokenizer_config.json")]
    assert folder.identity == Identity(tokenizer_sha256=sha256_files(files))
    assert (folder.vocab_size, folder.context, folder.name) == (49152, 8192,
                                                                str(tokenizer_folder))
    # the same tokenizer metadata in two GGUFs: one digest, whatever the tensors
    assert small.identity.tokenizer_sha256 == big.identity.tokenizer_sha256 != ""
    assert (big.context, big.name, small.context) == (131072, "llama-70b-like.Q4_0", 8192)
    assert big.sha256 == "" and big.weights is None


def test_bench_times_a_server_on_the_same_prompt_from_any_source(pulled_default,
                                                                   tokenizer_folder):
    """`bench --engine` draws its periodic prompt's ids from the tokenizer: the same with a
    tokenizer-only folder or the GGUF's metadata as with the full model."""
    from kolibri_cli.bench.engine_costs import periodic_prompt

    full = periodic_prompt(open_tokenizer(str(pulled_default.path)), longest=6)
    for source in (tokenizer_folder, pulled_default.gguf):
        assert periodic_prompt(open_tokenizer(str(source)), longest=6) == full


def test_a_40gb_gguf_is_read_for_its_metadata_alone(big_gguf, tmp_path):
    """Only the key-value section is read: a copy cut right after it (no tensor infos, no tensor
    data at all) gives the same tokenizer."""
    cut = tmp_path / "cut.gguf"
    with open(big_gguf, "rb") as f:
        head = f.read(1 << 24)
    cut.write_bytes(head[:_metadata_end(big_gguf)])
    a, b = gguf_tokenizer(big_gguf), gguf_tokenizer(cut)
    assert a.identity == b.identity and a.context == b.context
    text = "Hello, world! 123 <|im_start|>"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)


def _metadata_end(path: Path) -> int:
    """Where the key-value section ends (the reader's own cursor, re-walked)."""
    from kolibri_cli.store import vocabulary

    with open(path, "rb") as f:
        cur = vocabulary._Cursor(f, path.stat().st_size, path)
        cur.take(16)
        for _ in range(cur.unpack("<Q", 8)):
            key = vocabulary._string(cur)
            vocabulary._value(cur, cur.unpack("<I", 4), key)
        return cur.offset


# ---- the commands, with each source, leave the cache without weights -----------------------


@pytest.mark.parametrize("source", ["folder", "gguf", "server", "llama.cpp server"])
def test_import_record_and_measured_probe_without_weights(
        source, pulled_default, tokenizer_folder, big_gguf, shipped, tmp_path):
    home = tmp_path / "home"  # an empty cache: nothing may be pulled or imported into it
    run = cli(home)
    fake = llamacpp if source == "llama.cpp server" else vllm
    server = fake(Tokenizer(pulled_default.path))
    try:
        model = {"folder": ["-m", tokenizer_folder], "gguf": ["-m", big_gguf]}.get(source, [])
        imported, recorded = tmp_path / "imported.jsonl", tmp_path / "recorded.jsonl"
        done = run("goldens", "import", traces_of(shipped, tmp_path), "-o", imported, *model,
                   *([] if model else ["--engine", server.url]))
        assert done.exit_code == 0, done.stderr
        done = run("goldens", "record", "-p", PROMPTS, "-o", recorded, "--engine", server.url,
                   "-n", 16, *model)
        assert done.exit_code == 0, done.stderr
        for path in (imported, recorded):
            goldens = load_goldens(path)
            assert len(goldens) == len(shipped)
            for g in goldens:
                assert g.prompt_ids == shipped[g.id].prompt_ids, (path.name, g.id)
                assert g.model_sha256 == ""
        g = load_goldens(recorded)[0]
        if source == "server":
            assert g.identity == {"served_model": "smollm2-135m-instruct"}
        elif source == "llama.cpp server":  # no alias: the GGUF's file name, not its path
            assert g.identity == {"served_model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                                  "fingerprint": "llama.cpp Q4_1, 134515008 parameters, "
                                                 "96576768 bytes"}
            assert load_goldens(imported)[0].output_ids[-1] == 2  # its eos, from /props
        else:
            assert set(g.identity) == {"tokenizer_sha256", "served_model"}
        done = run("probe", "--goldens", recorded, "--measure", "--engine", server.url,
                   "--baseline", server.url, "--repeats", 1, "--k", 3, "--json", *model)
        assert done.exit_code == 0, done.stderr
        measured = next(r["measured"] for r in json.loads(done.stdout)["runs"] if r["measured"])
        assert measured["spec_equals_plain"] is True
        assert cached_models(home) == []  # no weights pulled, no GGUF imported
    finally:
        server.close()


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_from_logs_to_a_verdict_with_a_tokenizer_only_model(
        source, pulled_default, tokenizer_folder, big_gguf, shipped, tmp_path):
    """docs/engines.md's sequence with -m a tokenizer-only model and an empty kolibri home:
    logged traffic imported, the llama.cpp server's c(n) by prompt evaluation (timed on the
    full model's periodic prompt), and the probe's verdict priced with it."""
    from kolibri_cli.bench.engine_costs import periodic_prompt

    home, k = tmp_path / "home", 3
    run, model = cli(home), ["-m", tokenizer_folder if source == "folder" else big_gguf]
    server = llamacpp(Tokenizer(pulled_default.path))
    try:
        imported = tmp_path / "imported.jsonl"
        done = run("goldens", "import", traces_of(shipped, tmp_path), "-o", imported, *model)
        assert done.exit_code == 0, done.stderr
        assert [g.prompt_ids for g in load_goldens(imported)] == \
            [g.prompt_ids for g in shipped.values()]
        done = run("bench", "--engine", server.url, "--k", k, "--repeats", 2, "--json", *model)
        assert done.exit_code == 0, done.stderr
        costs = json.loads(done.stdout)["costs_option"]
        assert costs == ",".join(f"{prompt_ms(n) / prompt_ms(1):.3f}" for n in range(1, k + 2))
        full = periodic_prompt(open_tokenizer(str(pulled_default.path)), longest=k + 1)
        timed = [b["prompt"] for _, p, b in server.requests if p == "/completion"]
        assert len(timed) == 2 * (k + 2) and all(t[:len(full)] == full for t in timed)
        done = run("probe", "--goldens", imported, "--costs", costs, "--proposer",
                   "llamacpp-simple", "--k", k, "--window", 2, "--json")
        assert done.exit_code == 0, done.stderr
        verdict = json.loads(done.stdout)
        assert verdict["best"]["proposer"] == "llamacpp-simple"
        assert verdict["comparison"][0]["modelled_speedup"] > 0
        assert cached_models(home) == []
    finally:
        server.close()


def test_goldens_are_matched_to_models_by_identity(tokenizer_folder, pulled_default, tmp_path):
    from kolibri_cli.goldens.traces import import_traces

    other = tmp_path / "other-tokenizer"
    shutil.copytree(tokenizer_folder, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps(config | {"model_max_length": 9}))
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"}]}) + "\n")
    goldens = import_traces(path, open_tokenizer(str(tokenizer_folder)))
    check_model_matches(open_tokenizer(str(tokenizer_folder)), goldens, False)
    full = open_tokenizer(str(pulled_default.path))  # weights: matched by their sha256 only
    check_model_matches(full, goldens, False)
    with pytest.raises(KolibriError, match=r"recorded with tokenizer sha256 '[0-9a-f]{12}…', not"):
        check_model_matches(open_tokenizer(str(other)), goldens, False)
    check_model_matches(open_tokenizer(str(other)), goldens, True)
    served = TokenizerOnly("s", full.tokenizer, None, None, (2,), Identity(served_model="a"))
    g = goldens[0]
    g.identity = {"served_model": "b", "fingerprint": "f"}
    with pytest.raises(KolibriError, match="recorded with served model 'b', not 'a'"):
        check_model_matches(served, [g], False)


def test_a_model_that_must_run_says_it_needs_weights(tokenizer_folder, tmp_path):
    run, out = cli(tmp_path / "home"), tmp_path / "g.jsonl"
    record = ["goldens", "record", "-p", PROMPTS, "-o", out, "-n", 4]
    for args in (["generate", "hi"], ["chat"], ["serve"], ["bench"],
                 ["goldens", "check", DEFAULT_CHAT], record, [*record, "--engine", "transformers"],
                 ["probe", "--goldens", DEFAULT_CHAT, "--measure"],
                 ["probe", "--goldens", DEFAULT_CHAT, "--bench"]):
        done = run(*args, "-m", tokenizer_folder)
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 1 and len(lines) == 1, (args, done.stderr)
        assert "has no *.safetensors weights" in lines[0] and "needs them" in lines[0], args
        assert done.stdout == "" and not out.exists(), args


# ---- servers that cannot tokenize, or only text ---------------------------------------------


def test_a_server_without_a_tokenizer_is_refused_in_one_line(tmp_path, shipped):
    server = openai_only()
    try:
        done = cli(tmp_path / "home")("goldens", "import", traces_of(shipped, tmp_path), "-o",
                                      tmp_path / "g.jsonl", "--engine", server.url)
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 1 and len(lines) == 1, done.stderr
        assert "cannot tokenize: it has no /tokenize endpoint" in lines[0]
        assert "--model" in lines[0] and not (tmp_path / "g.jsonl").exists()
    finally:
        server.close()


def test_sglang_tokenizes_text_but_not_chat_messages(pulled_default, shipped, tmp_path):
    server = vllm(Tokenizer(pulled_default.path), sglang=True)
    run = cli(tmp_path / "home")
    try:
        done = run("goldens", "record", "-p", PROMPTS, "-o", tmp_path / "chat.jsonl",
                   "--engine", server.url, "-n", 4)
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 1 and len(lines) == 1, done.stderr
        assert "does not render chat messages" in lines[0]
        done = run("goldens", "record", "-p", PROMPTS, "-o", tmp_path / "raw.jsonl",
                   "--engine", server.url, "-n", 4, "--raw", "--limit", 2)
        assert done.exit_code == 0, done.stderr
        full = Tokenizer(pulled_default.path)
        for g in load_goldens(tmp_path / "raw.jsonl"):
            assert g.prompt_ids == full.encode(g.prompt) and g.reference["retokenized"]
            assert g.identity == {"served_model": "smollm2-135m-instruct",
                                  "fingerprint": "weight_version v7"}
    finally:
        server.close()
