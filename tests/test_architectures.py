"""Every supported architecture and RoPE type against transformers itself.

transformers builds a tiny random model from a config (no download) and saves it with
`save_pretrained` (float32, and bfloat16 for each architecture); kolibri loads the folder and
must give transformers' logits (max abs diff < 1e-4), its 32 greedy ids, spec == plain, and
bitwise batch invariance. The bf16 reference is transformers run in float32 on the bf16-rounded
weights (what kolibri computes after widening them exactly)."""

import copy
import json

import numpy as np
import pytest
from conftest import TINY_LLAMA_CONFIG, write_tiny_tokenizer

from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.rope import rope_frequencies
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.info import model_info
from kolibri_cli.store.models import open_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64, "rope_theta": 10000.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "rope_theta": 1e6}

# name -> (transformers class, config changes). Windows of 8 are crossed by the 50-token inputs.
CASES = {
    "llama": ("LlamaForCausalLM", {}),
    "llama-linear": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}),
    "llama3-tied": ("LlamaForCausalLM", {"rope_parameters": LLAMA3, "tie_word_embeddings": True,
                                         "num_hidden_layers": 3}),
    "mistral-window": ("MistralForCausalLM", {"sliding_window": 8, "head_dim": 16}),
    "qwen2-tied": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen2-window": ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 8,
                                          "max_window_layers": 1}),
    "qwen3": ("Qwen3ForCausalLM", {"head_dim": 32}),
    "qwen3-yarn": ("Qwen3ForCausalLM", {"head_dim": 32, "rope_parameters": YARN}),
    "qwen3-yarn-mscale": ("Qwen3ForCausalLM", {"rope_parameters": YARN | {
        "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16.0}}),
}
# Attention widths that differ from the hidden size (64) on every architecture, KV widths that
# are not D / (H / KVH), head dims that are no multiple of the SIMD width: q 4 x 32 = 128 > 64
# (Qwen3-0.6B: 16 x 128 = 2048 against 1024), q 8 x 6 = 48 < 64 with kv 2 x 6, and 16 query
# heads of 10 sharing one KV head.
SHAPES = {
    "q-wide": {"head_dim": 32},
    "q-narrow": {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 6},
    "mqa-odd": {"num_attention_heads": 16, "num_key_value_heads": 1, "head_dim": 10},
}
FAMILIES = {"llama": ("LlamaForCausalLM", {}),
            "mistral": ("MistralForCausalLM", {"sliding_window": 8}),
            "qwen2": ("Qwen2ForCausalLM", {}),
            "qwen3": ("Qwen3ForCausalLM", {})}
CASES |= {f"{family}-{shape}": (arch, changes | SHAPES[shape])
          for family, (arch, changes) in FAMILIES.items() for shape in SHAPES}
BF16 = ["llama", "mistral-window", "qwen2-tied", "qwen3"]
PROMPT = [5, 17, 923, 4, 4, 88, 5, 17, 923, 4, 31, 5, 17]  # repeats: drafts get proposed


def hf_model(arch: str, changes: dict, seed: int = 0):
    torch.manual_seed(seed)
    config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**(BASE | changes))
    config._attn_implementation = "eager"
    hf = getattr(transformers, arch)(config).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: make both matter
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    return hf


def saved(hf, folder, dtype):
    """save_pretrained in `dtype` + a tokenizer; the float32 model holding the saved values."""
    ref = copy.deepcopy(hf)
    if dtype == "bf16":  # state_dict only: the inv_freq buffer must stay float32
        rounded = {k: v.to(torch.bfloat16).float() for k, v in hf.state_dict().items()}
        ref.load_state_dict(rounded)
        copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(folder)
    else:
        hf.save_pretrained(folder)
    write_tiny_tokenizer(folder)
    return ref


def hf_greedy(hf, prompt, n):
    seq = list(prompt)
    with torch.no_grad():  # a plain loop: generate() applies logits processors
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def run_split(tf, ids, cuts):
    cache, rows, pos = tf.new_cache(len(ids)), [], 0
    for end in [*cuts, len(ids)]:
        rows.append(tf.forward(ids[pos:end], pos, cache))
        pos = end
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name/dtype -> (kolibri Model, transformers float32 reference), built once."""
    cache = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            arch, changes = CASES[name]
            folder = tmp_path_factory.mktemp(f"{name}-{dtype}")
            ref = saved(hf_model(arch, changes), folder, dtype)
            cache[name, dtype] = open_model(str(folder)), ref
        return cache[name, dtype]

    return get


PARAMS = [(n, "f32") for n in CASES] + [(n, "bf16") for n in BF16]


@pytest.mark.parametrize(("name", "dtype"), PARAMS)
def test_logits_match_transformers(built, name, dtype):
    model, ref = built(name, dtype)
    assert model.config.architecture == CASES[name][0]
    ids = np.random.default_rng(1).integers(0, 1000, 50)
    with torch.no_grad():
        expect = ref(torch.tensor(ids[None])).logits[0].numpy()
    got = run_split(model.transformer, ids, [20, 21, 27])
    assert got.dtype == np.float32
    assert expect.std() > 0.1  # not a vacuous comparison of near-zero logits
    assert np.abs(got - expect).max() < 1e-4


@pytest.mark.parametrize(("name", "dtype"), PARAMS)
def test_greedy_and_spec_match_transformers(built, name, dtype):
    model, ref = built(name, dtype)
    expect = hf_greedy(ref, PROMPT, 32)
    plain = generate_plain(model, PROMPT, 32)
    spec = generate_spec(model, PROMPT, 32, NgramProposer(5, 1, 4))
    assert plain.output_ids == expect
    assert spec.output_ids == expect
    assert spec.spec_stats()["drafts_proposed"] > 0


@pytest.mark.bitwise
@pytest.mark.parametrize("name", list(CASES))
def test_batch_invariance(built, name):
    tf = built(name, "f32")[0].transformer
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 1000, 30)
    prefill = run_split(tf, ids, [])
    assert np.array_equal(prefill, run_split(tf, ids, list(range(1, 30))))
    for _ in range(4):
        cuts = sorted(rng.choice(np.arange(1, 30), size=rng.integers(1, 8), replace=False))
        assert np.array_equal(prefill, run_split(tf, ids, cuts))


@pytest.mark.parametrize("name", [n for n in CASES if "rope_parameters" in CASES[n][1]])
def test_rope_frequencies_equal_transformers(built, name):
    """inv_freq and the cos/sin scale, against the values transformers' rotary module holds."""
    model, ref = built(name, "f32")
    inv_freq, scale = rope_frequencies(model.config)
    rotary = ref.model.rotary_emb
    np.testing.assert_allclose(inv_freq, rotary.inv_freq.numpy(), rtol=2e-7, atol=0)
    assert scale == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert model.config.rope_scaling.rope_type == CASES[name][1]["rope_parameters"]["rope_type"]


def test_features_read_from_config(built):
    c = {n: built(n, "f32")[0].config for n in ("qwen2-window", "qwen3", "mistral-window")}
    assert c["qwen2-window"].qkv_bias and not c["qwen2-window"].qk_norm
    assert c["qwen2-window"].sliding_window == 8 and c["qwen2-window"].sliding_layers == (1,)
    assert c["qwen3"].qk_norm and not c["qwen3"].qkv_bias and c["qwen3"].head_dim == 32
    assert c["mistral-window"].sliding_layers == (0, 1)
    assert built("qwen2-tied", "f32")[0].config.sliding_window == 0  # use_sliding_window false


def test_model_info_reports_features(built):
    info = model_info(str(built("qwen3-yarn", "f32")[0].path)).to_dict()
    assert (info["architecture"], info["rope_type"], info["qk_norm"], info["qkv_bias"]) == (
        "Qwen3ForCausalLM", "yarn", True, False)
    assert (info["gqa_ratio"], info["head_dim"], info["tied_head"], info["sliding_window"]) == (
        2, 32, False, 0)
    info = model_info(str(built("qwen2-window", "f32")[0].path)).to_dict()
    assert (info["qkv_bias"], info["sliding_window"], info["sliding_layers"]) == (True, 8, 1)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("changes", "message"), [
    ({"architectures": ["PhiForCausalLM"], "model_type": "phi"}, "'PhiForCausalLM'"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2_moe"}, "'qwen2_moe'"),
    ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0}}, "rope type 'longrope'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_unsupported_configs_name_the_problem(tiny_llama_folder, changes, message):
    with pytest.raises(KolibriError, match=message):
        open_model(str(tiny_llama_folder(config_changes=changes)))


def test_missing_qwen_tensors_are_listed(tiny_llama_folder):
    """A Llama checkpoint relabelled Qwen3 lacks the q/k norms: the error names them."""
    folder = tiny_llama_folder(config_changes={"architectures": ["Qwen3ForCausalLM"],
                                               "model_type": "qwen3"})
    with pytest.raises(KolibriError, match=r"missing tensors .*q_norm\.weight"):
        open_model(str(folder))


def test_config_json_of_transformers_round_trips():
    """What transformers 5 writes for each architecture is what kolibri reads."""
    for name, (arch, changes) in CASES.items():
        hf_config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**(BASE | changes))
        d = json.loads(hf_config.to_json_string()) | {"architectures": [arch]}
        config = ModelConfig.from_dict(d)
        assert config.head_dim == (getattr(hf_config, "head_dim", None) or 16), name
        assert config.tie_word_embeddings == changes.get("tie_word_embeddings", False), name


def test_default_llama_has_no_optional_parts():
    config = ModelConfig.from_dict(TINY_LLAMA_CONFIG)
    assert (config.qkv_bias, config.qk_norm, config.sliding_window) == (False, False, 0)
    assert config.rope_scaling.rope_type == "default"
