"""The loader on tiny hand-made folders: formats, widening, and every bad-folder error."""

import json
import struct

import numpy as np
import pytest
from conftest import TINY_LLAMA_CONFIG, tiny_llama_tensors
from safetensors.numpy import save_file

from kolibri_cli.engine import loader
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.info import model_info
from kolibri_cli.store.models import open_model

CONFIG = ModelConfig.from_dict(TINY_LLAMA_CONFIG)


def load(folder) -> dict[str, np.ndarray]:
    config = ModelConfig.from_file(folder / "config.json")
    return loader.load_tensors(loader.check_folder(folder), config)


def write_raw_safetensors(path, tensors: dict[str, tuple[str, tuple, bytes]]) -> None:
    """Write a safetensors file by hand: name -> (dtype, shape, raw little-endian bytes)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_single_file_loads_exact_float32(tiny_llama_folder):
    tensors = tiny_llama_tensors()
    got = load(tiny_llama_folder())
    assert set(got) == set(tensors)
    for name, a in tensors.items():
        assert got[name].dtype == np.float32 and np.array_equal(got[name], a), name


def test_sharded_equals_single(tiny_llama_folder):
    tensors = tiny_llama_tensors()
    single = load(tiny_llama_folder(name="single"))
    sharded = tiny_llama_folder(name="sharded")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(sharded / shard))
    weight_map = {n: shard for shard, members in shards.items() for n in members}
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    got = load(sharded)
    assert set(got) == set(single)
    for name in single:
        assert np.array_equal(got[name], single[name]), name


def test_float16_widens_exactly(tiny_llama_folder):
    half = {n: a.astype(np.float16) for n, a in tiny_llama_tensors().items()}
    got = load(tiny_llama_folder(tensors=half))
    for name, a in half.items():
        assert got[name].dtype == np.float32
        assert np.array_equal(got[name], a.astype(np.float32)), name
    assert model_info(str(tiny_llama_folder(tensors=half, name="h"))).dtypes == ["F16"]


def test_bfloat16_widens_exactly(tiny_llama_folder, tmp_path):
    tensors = tiny_llama_tensors()
    # bf16 = the high half of an f32 (round toward zero here; any bit pattern is a valid bf16)
    bits = {n: (a.view(np.uint32) >> 16).astype(np.uint16) for n, a in tensors.items()}
    folder = tiny_llama_folder(name="bf16")
    write_raw_safetensors(folder / "model.safetensors", {
        n: ("BF16", b.shape, b.astype("<u2").tobytes()) for n, b in bits.items()})
    got = load(folder)
    for name, b in bits.items():
        expected = (b.astype(np.uint32) << 16).view(np.float32)
        assert got[name].dtype == np.float32 and np.array_equal(got[name], expected), name
    torch = pytest.importorskip("torch")
    name = "model.layers.0.self_attn.q_proj.weight"
    ref = torch.from_numpy(bits[name].view(np.int16)).view(torch.bfloat16).to(torch.float32)
    assert np.array_equal(got[name], ref.numpy())
    # inf, -inf, the smallest subnormal, -0, 1
    special = np.array([0x7F80, 0xFF80, 0x0001, 0x8000, 0x3F80], dtype=np.uint16)
    write_raw_safetensors(tmp_path / "s.safetensors", {"x": ("BF16", (5,), special.tobytes())})
    x = loader.read_safetensors(tmp_path / "s.safetensors")["x"]
    ref = torch.from_numpy(special.view(np.int16)).view(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(x.view(np.uint32), ref.view(np.uint32))


def test_missing_tensors_are_listed_first_names_first(tiny_llama_folder):
    tensors = tiny_llama_tensors()
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KolibriError) as e:
        load(tiny_llama_folder(tensors=tensors))
    assert "missing tensors model.layers.0.self_attn.k_proj.weight, " \
           "model.layers.1.mlp.up_proj.weight" in str(e.value)


def test_many_missing_tensors_are_summarised(tiny_llama_folder):
    tensors = {"model.embed_tokens.weight": tiny_llama_tensors()["model.embed_tokens.weight"]}
    with pytest.raises(KolibriError, match=r"missing tensors model\.norm\.weight, "
                       r"lm_head\.weight, model\.layers\.0\.input_layernorm\.weight and 17 more"):
        load(tiny_llama_folder(tensors=tensors))


def test_wrong_shape_names_tensor_and_both_shapes(tiny_llama_folder):
    tensors = tiny_llama_tensors()
    tensors["model.layers.1.self_attn.v_proj.weight"] = np.zeros((64, 64), np.float32)
    with pytest.raises(KolibriError, match=r"tensor model\.layers\.1\.self_attn\.v_proj\.weight "
                                           r"has shape \(64, 64\), config expects \(32, 64\)"):
        load(tiny_llama_folder(tensors=tensors))


def test_unexpected_tensor_is_named(tiny_llama_folder):
    bias = "model.layers.0.self_attn.q_proj.bias"
    tensors = tiny_llama_tensors() | {bias: np.zeros(64, np.float32)}
    with pytest.raises(KolibriError, match=f"unexpected tensors {bias}"):
        load(tiny_llama_folder(tensors=tensors))


def test_tied_checkpoint_may_carry_lm_head_and_rotary_buffers(tiny_llama_folder):
    buffer = "model.layers.0.self_attn.rotary_emb.inv_freq"
    tensors = tiny_llama_tensors() | {buffer: np.ones(8, np.float32)}
    folder = tiny_llama_folder(tensors=tensors, config_changes={"tie_word_embeddings": True})
    assert "lm_head.weight" not in load(folder)
    info = model_info(str(folder))
    embed = 1000 * 64
    assert info.parameters == sum(a.size for a in tiny_llama_tensors().values()) - embed
    assert info.bytes_per_token == 4 * info.parameters and info.tied_head


def test_untied_info_excludes_the_embedding_from_bytes_read(tiny_llama_folder):
    info = model_info(str(tiny_llama_folder()))
    total = sum(a.size for a in tiny_llama_tensors().values())
    assert (info.parameters, info.bytes_per_token) == (total, 4 * (total - 1000 * 64))
    assert (info.architecture, info.context_length, info.layers, info.heads, info.kv_heads) == (
        "LlamaForCausalLM", 256, 2, 4, 2)
    assert info.chat_template is False and info.dtypes == ["F32"]


@pytest.mark.parametrize("keep", [0, 7, 100, -1])
def test_truncated_file_is_a_clear_error(tiny_llama_folder, keep):
    folder = tiny_llama_folder()
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(KolibriError, match="truncated safetensors file"):
        load(folder)


def test_garbage_and_inconsistent_headers(tiny_llama_folder, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]" + b"\0" * 16)
    with pytest.raises(KolibriError, match="not a safetensors file"):
        loader.read_safetensors(bad)
    write_raw_safetensors(bad, {"x": ("F32", (3, 2), b"\0" * 20)})  # the library's words
    with pytest.raises(KolibriError, match=r"bad\.safetensors: not a safetensors file \(.+\)$"):
        loader.read_safetensors(bad)
    write_raw_safetensors(bad, {"x": ("I32", (2,), b"\0" * 8)})
    with pytest.raises(KolibriError, match="tensor x has dtype I32; kolibri reads F32/F16/BF16"):
        loader.read_safetensors(bad)


def test_index_naming_a_missing_shard(tiny_llama_folder):
    folder = tiny_llama_folder()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(KolibriError, match="shard model-00002-of-00002.safetensors named in"):
        load(folder)
    (folder / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(KolibriError, match="not a safetensors index"):
        load(folder)


def test_folder_errors(tmp_path, tiny_llama_folder):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    no_tok = tiny_llama_folder(name="no-tok")
    (no_tok / "tokenizer.json").unlink()
    no_weights = tiny_llama_folder(name="no-weights")
    (no_weights / "model.safetensors").unlink()
    cases = {
        tmp_path / "missing": "does not exist",
        tmp_path / "file": "is a file, not a model folder nor a .gguf file",
        tmp_path / "empty": "has no config.json",
        no_tok: "has no tokenizer.json",
        no_weights: r"has no \*\.safetensors weights",
    }
    for folder, message in cases.items():
        with pytest.raises(KolibriError, match=message):
            open_model(str(folder))


@pytest.mark.parametrize(("changes", "message"), [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
     "unsupported architecture 'GPT2LMHeadModel'"),
    ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture 'MistralForCausalLM'"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 8.0}},
     "unsupported rope type 'longrope'"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ({"hidden_size": "wide"}, "wrong type"),
])
def test_config_errors_name_the_problem(tiny_llama_folder, changes, message):
    folder = tiny_llama_folder(config_changes=changes)
    with pytest.raises(KolibriError, match=message) as e:
        open_model(str(folder))
    assert str(folder / "config.json") in str(e.value)


def test_config_missing_field_and_bad_json(tmp_path):
    with pytest.raises(KolibriError, match="missing required field 'vocab_size'"):
        ModelConfig.from_dict({k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "vocab_size"})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(KolibriError, match="not valid JSON"):
        ModelConfig.from_file(tmp_path / "config.json")


def test_transformers_5_rope_parameters_are_read():
    """transformers >= 5 saves rope_theta under rope_parameters: not silently 10000."""
    d = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "rope_theta"}
    d["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    assert ModelConfig.from_dict(d).rope_theta == 500000.0
    d["rope_parameters"]["rope_type"] = "dynamic"
    with pytest.raises(KolibriError, match="unsupported rope type 'dynamic'"):
        ModelConfig.from_dict(d)


def test_transformers_config_round_trip():
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-6)
    config = ModelConfig.from_dict(hf.to_dict())
    assert (config.rope_theta, config.rms_norm_eps, config.head_dim) == (5000.0, 1e-6, 16)
    assert config.weight_shapes() == CONFIG.weight_shapes()


# ---- through the safetensors library ----


def _mixed_dtype_folder(tiny_llama_folder):
    """The tiny model stored F16, BF16 and F32 by turns, the tensors in the file in reverse name
    order; and the same values widened, stored F32 (what kolibri must load from the first)."""
    tensors, mixed, widened = tiny_llama_tensors(), {}, {}
    for i, (name, a) in enumerate(sorted(tiny_llama_tensors().items(), reverse=True)):
        if i % 3 == 0:
            mixed[name] = ("F16", a.shape, a.astype("<f2").tobytes())
            widened[name] = a.astype(np.float16).astype(np.float32)
        elif i % 3 == 1:
            bits = (a.view(np.uint32) >> 16).astype("<u2")
            mixed[name] = ("BF16", a.shape, bits.tobytes())
            widened[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            mixed[name] = ("F32", a.shape, a.astype("<f4").tobytes())
            widened[name] = a
    assert set(widened) == set(tensors)
    folder = tiny_llama_folder(name="mixed")
    write_raw_safetensors(folder / "model.safetensors", mixed)
    return folder, tiny_llama_folder(tensors=widened, name="widened")


def test_safetensors_of_every_dtype_load_as_their_widened_values(tiny_llama_folder, tmp_path,
                                                                 monkeypatch):
    """F16 through safetensors' numpy API, F32 memory-mapped at the offsets of the header it
    validated, BF16 widened by kolibri: the same greedy ids as the float32 folder."""
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "home"))
    mixed, widened = _mixed_dtype_folder(tiny_llama_folder)
    got = loader.read_safetensors(mixed / "model.safetensors")
    f32 = [n for n, a in got.items() if isinstance(a, np.memmap)]
    assert len(f32) == 7 and all(got[n].dtype == np.float32 for n in got)  # 21 tensors by turns

    def ids(folder) -> list[int]:
        r = CliRunner().invoke(app, ["generate", "--model", str(folder), "--raw", "-n", "12",
                                     "--json", "1 2 3"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["output_ids"]

    assert ids(mixed) == ids(widened)
    info = CliRunner().invoke(app, ["model", "info", str(mixed), "--json"])
    assert json.loads(info.stdout)["dtypes"] == ["BF16", "F16", "F32"]


@pytest.mark.parametrize("case", ["overlap", "hole", "metadata not text"])
def test_what_safetensors_refuses_kolibri_refuses(tiny_llama_folder, tmp_path, monkeypatch, case):
    """Headers kolibri's own parser used to accept — two tensors on the same bytes, bytes no
    tensor owns, metadata that is not text — are refused by the library: one line each."""
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    monkeypatch.setenv("KOLIBRI_HOME", str(tmp_path / "home"))
    folder = tiny_llama_folder()
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    header = {"overlap": {"a": entry, "b": entry},
              "hole": {"a": entry | {"data_offsets": [8, 16]}},
              "metadata not text": {"__metadata__": {"n": 1}, "a": entry}}[case]
    head = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * 16)
    for args in (["model", "info", str(folder)], ["generate", "--model", str(folder), "hi"]):
        r = CliRunner().invoke(app, args)
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 1 and r.stdout == "" and len(lines) == 1, r.output
        assert lines[0].startswith(f"error: {folder / 'model.safetensors'}: "), lines
        assert "safetensors file" in lines[0], lines
