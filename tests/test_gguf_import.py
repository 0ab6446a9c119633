"""`kolibri model import`: tiny GGUFs written with the `gguf` library's own writer, from tiny
transformers models (llama with llama.cpp's Q/K permutation, qwen2 with biases, qwen3 with q/k
norms), F32 and Q8_0 tensors. The cache must hold exactly the dequantized tensors, the model
must give transformers' logits, and every refusal leaves nothing in the cache."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.engine import blockfile
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.errors import KolibriError
from kolibri_cli.store import cache as store
from kolibri_cli.store import gguf as gguf_convert
from kolibri_cli.store.models import open_model

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Q = gguf.GGMLQuantizationType

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["1 2", "12 3", "4 5", "h e", "l l", "he ll", "hell o"]


def vocab() -> tuple[list[str], list[int]]:
    """Specials (type 3, control), the 256 byte symbols, then one token per merge (type 1)."""
    from tokenizers import pre_tokenizers

    tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens += ["".join(m.split()) for m in MERGES]
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


N_VOCAB = len(vocab()[0])
HF = {  # case -> (transformers class, config changes)
    "llama": ("LlamaForCausalLM", {"rope_theta": 10000.0}),
    "qwen2": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", {"head_dim": 32}),
    # Llama 3.1 RoPE: llama.cpp stores only the per-frequency divisors (rope_freqs.weight)
    "llama3": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 500000.0}}),
    # YaRN: {arch}.rope.scaling.{type,factor,original_context_length}
    "qwen2-yarn": ("Qwen2ForCausalLM", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "rope_theta": 10000.0}}),
}


def hf_model(case: str):
    cls, changes = HF[case]
    torch.manual_seed(0)
    base = dict(vocab_size=N_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None)
    config = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**(base | changes))
    config._attn_implementation = "eager"
    hf = getattr(transformers, cls)(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith((".bias", "norm.weight")):
                p.add_(0.3 * torch.randn_like(p))
    return hf


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rotate-half -> interleaved rows)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_tensors(hf, arch: str) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, laid out as llama.cpp's converter writes them."""
    c, out = hf.config, {}
    for name, t in hf.state_dict().items():
        a = t.numpy().astype(np.float32)
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = llama_cpp_permute(a, heads)
        glob = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
        if name in glob:
            out[glob[name]] = a
            continue
        _, _, i, *rest = name.split(".")
        out[f"blk.{i}.{GGUF_NAMES['.'.join(rest[:-1])]}.{rest[-1]}"] = a
    return out


def write_gguf(path, hf, arch: str, quant: Q = Q.F32, pre: str = "smollm",
               extra=None) -> dict[str, np.ndarray]:
    """Write the GGUF; return GGUF name -> what a reader must dequantize it to."""
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens, types = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    rope = c.rope_parameters
    if rope["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    elif rope["rope_type"] == "llama3":  # convert_hf_to_gguf.py's divisors, float32
        default = 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
        divisors = default / hf.model.rotary_emb.inv_freq.numpy().astype(np.float64)
        extra = {"rope_freqs.weight": divisors.astype(np.float32)} | (extra or {})
    expect = {}
    for name, a in (gguf_tensors(hf, arch) | (extra or {})).items():
        if quant != Q.F32 and a.ndim == 2:  # matrices quantized, norms/biases F32 (as llama.cpp)
            q = gguf.quants.quantize(a, quant)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=quant)
            expect[name] = gguf.quants.dequantize(q, quant)
        else:
            w.add_tensor(name, a)
            expect[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


def assert_cache_clean(name: str) -> None:
    models = store.cache_root() / "models"
    left = sorted(p.name for p in models.iterdir()) if models.is_dir() else []
    assert left == [], left
    assert name not in store.installed_models()


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("case", list(HF))
def test_f32_import_gives_transformers_logits(kolibri_home, tmp_path, case):
    hf = hf_model(case)
    path = tmp_path / f"tiny-{case}.gguf"
    write_gguf(path, hf, case.split("-")[0].replace("llama3", "llama"))
    name, folder = store.import_gguf(path)
    assert name == f"tiny-{case}" and folder == store.model_dir(name)
    model = open_model(name)
    assert model.config.architecture == HF[case][0]
    assert model.config.rope_scaling.rope_type == hf.config.rope_parameters["rope_type"]
    assert model.source_sha256 == sha256_files([path])
    ids = np.random.default_rng(0).integers(0, N_VOCAB, 40)
    with torch.no_grad():
        expect = hf(torch.tensor(ids[None])).logits[0].numpy()
    got = model.transformer.forward(ids, 0, model.transformer.new_cache(40))
    assert np.abs(got - expect).max() < 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_q8_0_import_holds_the_gguf_blocks(kolibri_home, tmp_path, arch):
    """The cache keeps Q8_0 blocks (not float32), and they decode to the GGUF's tensors."""
    hf = hf_model(arch)
    path = tmp_path / "q8.gguf"
    expect = write_gguf(path, hf, arch, quant=Q.Q8_0)
    _, folder = store.import_gguf(path, name="q8")
    types, sizes = blockfile.storage(folder / blockfile.NAME)
    assert types == {"F32": types["F32"], "Q8_0": len([a for a in expect.values() if a.ndim == 2])}
    assert sum(sizes.values()) < sum(a.nbytes for a in expect.values()) / 3
    got = blockfile.float_tensors(folder / blockfile.NAME)
    heads = {"q_proj": hf.config.num_attention_heads, "k_proj": hf.config.num_key_value_heads}
    assert len(got) == len(expect)
    for gname, a in expect.items():
        hname = gguf_convert.hf_name(gname)
        proj = hname.split(".")[-2]
        if arch == "llama" and proj in heads:
            a = gguf_convert.unpermute(a, heads[proj])
        assert got[hname].dtype == np.float32 and np.array_equal(got[hname], a), hname
    q_rows = expect["blk.0.attn_q.weight"]
    q_orig = hf.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert not np.array_equal(q_rows, q_orig)  # really quantized...
    assert np.abs(got["model.layers.0.self_attn.q_proj.weight"] - q_orig).max() < 0.01  # ...near


def test_tokenizer_and_chat_template_come_from_the_gguf(kolibri_home, tmp_path):
    hf = hf_model("llama")
    split = {}
    for pre in ("smollm", "gpt-2", "llama-bpe", "qwen2"):
        write_gguf(tmp_path / f"{pre}.gguf", hf, "llama", pre=pre)
        model = open_model(store.import_gguf(tmp_path / f"{pre}.gguf")[0])
        tok = model.tokenizer
        assert tok.chat_template == TEMPLATE
        assert tok.decode(tok.encode("hello 12345<|im_end|>")) == "hello 12345"
        split[pre] = [tok._tok.id_to_token(i) for i in tok.encode("hello 12345")]
    assert split["llama-bpe"] == split["gpt-2"] == ["hello", "Ġ", "123", "45"]
    assert split["smollm"] == split["qwen2"] == ["hello", "Ġ", "1", "2", "3", "4", "5"]
    config = json.loads((store.model_dir("smollm") / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")


def test_cli_import_then_info(kolibri_home, tmp_path):
    write_gguf(tmp_path / "m.gguf", hf_model("qwen3"), "qwen3")
    result = CliRunner().invoke(app, ["model", "import", str(tmp_path / "m.gguf"),
                                      "--name", "mine"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and "mine ready" in result.stderr
    info = json.loads(CliRunner().invoke(app, ["model", "info", "mine", "--json"]).stdout)
    assert (info["architecture"], info["qk_norm"], info["head_dim"]) == (
        "Qwen3ForCausalLM", True, 32)
    assert info["source"]["gguf_sha256"] == sha256_files([tmp_path / "m.gguf"])
    again = CliRunner().invoke(app, ["model", "import", str(tmp_path / "m.gguf"), "--name", "mine"])
    assert again.exit_code == 1 and "already in the cache" in again.stderr


# ---------------------------------------------------------------- refusals


def test_unsupported_pre_tokenizer_is_named(kolibri_home, tmp_path):
    write_gguf(tmp_path / "x.gguf", hf_model("llama"), "llama", pre="deepseek-llm")
    with pytest.raises(KolibriError, match="pre-tokenizer 'deepseek-llm'"):
        store.import_gguf(tmp_path / "x.gguf")
    assert_cache_clean("x")


def test_unsupported_tensor_type_is_named(kolibri_home, tmp_path):
    extra = {"blk.0.attn_q.weight": np.zeros((64, 64), np.int32)}  # I32: not dequantizable
    write_gguf(tmp_path / "x.gguf", hf_model("llama"), "llama", extra=extra)
    with pytest.raises(KolibriError, match="blk.0.attn_q.weight: quantization I32"):
        store.import_gguf(tmp_path / "x.gguf")
    assert_cache_clean("x")


def test_unsupported_architecture_is_named(kolibri_home, tmp_path):
    path = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KolibriError, match="GGUF architecture 'phi3'"):
        store.import_gguf(path)
    assert_cache_clean("x")


def test_too_big_for_memory_gives_both_numbers(kolibri_home, tmp_path, monkeypatch):
    write_gguf(tmp_path / "x.gguf", hf_model("llama"), "llama")
    monkeypatch.setattr(store, "free_memory", lambda: 1000)
    with pytest.raises(KolibriError, match=r"needs 0\.\d\d MB in kernel storage, but 0\.00 MB "
                                           r"of memory is available and [\d.]+ [GM]B of disk "
                                           r"is free"):
        store.import_gguf(tmp_path / "x.gguf")
    monkeypatch.setattr(store, "free_memory", lambda: 10**12)
    monkeypatch.setattr(store, "free_disk", lambda path: 2000)
    with pytest.raises(KolibriError, match=r"1000\.00 GB of memory is available and 0\.00 MB"):
        store.import_gguf(tmp_path / "x.gguf")
    assert_cache_clean("x")


def test_failure_during_conversion_leaves_nothing(kolibri_home, tmp_path, monkeypatch):
    write_gguf(tmp_path / "x.gguf", hf_model("llama"), "llama")

    def broken(reader):
        raise RuntimeError("simulated crash after the weights were written")

    monkeypatch.setattr(gguf_convert, "tokenizer_config", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        store.import_gguf(tmp_path / "x.gguf")
    assert_cache_clean("x")


def test_bad_names_and_missing_file(kolibri_home, tmp_path):
    with pytest.raises(KolibriError, match="name of a registry model"):
        store.import_gguf(tmp_path / "x.gguf", name=store.DEFAULT_MODEL)
    with pytest.raises(KolibriError, match="no such file"):
        store.import_gguf(tmp_path / "absent.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(KolibriError, match=r"not a GGUF file \(it starts with b'not '"):
        store.import_gguf(tmp_path / "junk.gguf")
    assert_cache_clean("x")


@pytest.mark.parametrize("keep", [4, 8, 24, 100, 1000, 0.5, -10])
def test_a_truncated_gguf_is_named_truncated(kolibri_home, tmp_path, keep):
    from crafted import write_gguf

    data = write_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    with pytest.raises(KolibriError, match="truncated or damaged"):
        store.import_gguf(cut, name="cut")  # was numpy's words alone ("index 0 is out of bounds")
    assert_cache_clean("cut")


# ---------------------------------------------------------------- caches of an older kolibri


def make_float32_cache(folder):
    """What an older kolibri left for the same GGUF: its tensors dequantized to float32
    safetensors, no block file."""
    from safetensors.numpy import save_file

    save_file(blockfile.float_tensors(folder / blockfile.NAME), str(folder / "model.safetensors"))
    (folder / blockfile.NAME).unlink()
    meta = json.loads((folder / "kolibri.json").read_text())
    meta.pop("files")  # it recorded no files either
    (folder / "kolibri.json").write_text(json.dumps(meta))
    assert store.is_float32_cache(folder)


def logits_of(model, n: int = 24) -> np.ndarray:
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, n)
    tf = model.transformer
    return tf.forward(ids, 0, tf.new_cache(n))


def test_float32_cache_is_replaced_by_blocks_once(kolibri_home, tmp_path):
    """An imported model cached as float32 is re-imported from its (unchanged) GGUF on first
    use; its logits are bitwise those of the float32 cache it replaces."""
    write_gguf(tmp_path / "m.gguf", hf_model("llama"), "llama", quant=Q.Q8_0)
    _, folder = store.import_gguf(tmp_path / "m.gguf", name="old")
    make_float32_cache(folder)
    notes = []
    old = open_model(str(folder), notify=notes.append)  # a path: loaded as it is
    assert old.weights.storage() == {"F32": sum(old.weights.storage().values())}
    assert len(notes) == 1 and "without file checksums" in notes[0]
    notes.clear()
    model = open_model("old", notify=notes.append, numerics="float32")  # Q8_0's default: int16
    assert len(notes) == 1 and "re-importing" in notes[0]
    assert (folder / blockfile.NAME).is_file() and not (folder / "model.safetensors").exists()
    assert "Q8_0" in model.weights.storage()
    assert np.array_equal(logits_of(model), logits_of(old))
    notes.clear()
    open_model("old", notify=notes.append)
    assert notes == []  # once


def test_float32_cache_without_its_gguf_keeps_working(kolibri_home, tmp_path):
    write_gguf(tmp_path / "m.gguf", hf_model("qwen2"), "qwen2", quant=Q.Q8_0)
    _, folder = store.import_gguf(tmp_path / "m.gguf", name="old")
    want = logits_of(open_model("old", numerics="float32"))  # Q8_0 blocks' default: int16
    make_float32_cache(folder)
    (tmp_path / "m.gguf").unlink()
    notes = []
    model = open_model("old", notify=notes.append)
    assert len(notes) == 1 and "not at hand" in notes[0] and "without file checksums" in notes[0]
    assert "kolibri model import" in notes[0] and "--name old --force" in notes[0]
    assert set(model.weights.storage()) == {"F32"} and store.is_float32_cache(folder)
    assert np.array_equal(logits_of(model), want)


def test_a_gguf_file_as_model_is_imported_once(kolibri_home, tmp_path):
    """`-m FILE.gguf` on generate imports the file as `kolibri model import` would (said on
    stderr), reuses that import while the file is unchanged, imports again when it changed, and
    refuses a cached model of the same name imported from another file."""
    path = tmp_path / "mine.gguf"
    write_gguf(path, hf_model("llama"), "llama")

    def generate(model):
        return CliRunner().invoke(app, ["generate", "-m", str(model), "--raw", "-n", "2",
                                        "--json", "hello"])

    first = generate(path)
    assert first.exit_code == 0, first.output
    assert f"importing {path} into the cache as mine" in first.stderr
    assert store.installed_models() == ["mine"]
    assert store.provenance(store.model_dir("mine"))["gguf"] == str(path.resolve())
    again = generate(path)
    assert again.exit_code == 0 and "importing" not in again.stderr
    assert json.loads(again.stdout)["output_ids"] == json.loads(first.stdout)["output_ids"]
    write_gguf(path, hf_model("llama"), "llama", quant=Q.Q8_0)  # other bytes, the same name
    changed = generate(path)
    assert changed.exit_code == 0 and "again: it changed since" in changed.stderr
    other = tmp_path / "elsewhere" / "mine.gguf"
    other.parent.mkdir()
    other.write_bytes(path.read_bytes())
    refused = generate(other)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"error: the cached model mine was not imported from {other}; import it under another "
        f"name: kolibri model import {other} --name NAME")
