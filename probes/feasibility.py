"""Regenerate docs/feasibility.md — the feasibility report for the default model.

    python probes/feasibility.py            (from the repo root, with kolibri installed:
                                             pip install -e '.[plot]'; ~35 min on 2 cores)
    python probes/feasibility.py CHUNK ...  only those chunks, each replacing its own section
                                             of the existing doc (the rest stays as it is)

The chunks, in the order the whole run takes them (each fits a 15-minute window on 2 cores):
  costs              `kolibri bench --k 8 --repeats 15 --json`, stored with its date, commit
                     and load in build/feasibility-bench.json: the one c(1..9) every later
                     chunk uses (the modelled speedups, the adaptive proposers), so chunks run
                     hours apart still price drafts alike; the other chunks measure it first
                     if it is missing. Rerun it to re-measure.
  bench              the speed section, from that stored measurement.
  chat               `kolibri probe probes/feasibility.toml` — the chat goldens: every chain
                     proposer x k x window simulated, each proposer's best setting measured
                     with the model; its JSON is kept in build/ for `trees`.
  trees              `probes/feasibility-trees.toml`, the same for the tree proposers, and
                     the two side by side (runs `chat` first if its JSON is missing or was
                     priced with another c(n)).
  llamacpp           llama.cpp's types at their upstream defaults on the chat goldens
                     (simulated).
  spec-bench-record  `kolibri goldens record --greedy` over Spec-Bench
                     (../shared/datasets/spec_bench/question.jsonl, 10 prompts per category,
                     128 new tokens), one category at a time into build/spec_bench/ (never
                     committed); categories already recorded are skipped, so an interrupted
                     run resumes. Names after it (`spec-bench-record qa rag`) record only
                     those categories.
  spec-bench         `kolibri probe --json` over the recorded chains (recording what is
                     missing first) at vLLM's rule k=5 window 1-4 and at the prompt lookup
                     setting Spec-Bench published (n-gram up to 3, 10 draft tokens); every
                     proposer's best setting on them (simulated), and the best chain and the
                     best tree proposer measured on 2 prompts per category.
  sampled            `kolibri goldens record` of the chat prompts sampled at T = 0.7 with 3
                     seeds (build/chat-t0.7.jsonl, kept for reruns), and `kolibri probe --json`
                     over them and over the greedy chat goldens: greedy vs sampled.

Each section says which command wrote it, at which commit on which CPU (and the load), how long
it took, and the c(n) it used.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from kolibri_cli.store.atomic import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
CHAT_PROMPTS = ROOT / "goldens/prompts/chat.jsonl"
CHAT_GOLDENS = ROOT / "goldens/smollm2-135m-instruct/chat.jsonl"
DOC = ROOT / "docs" / "feasibility.md"
BUILD = ROOT / "build"
COSTS_FILE = BUILD / "feasibility-bench.json"
CHAT_JSON = BUILD / "feasibility-chat.json"
SPEC_BENCH_DIR = BUILD / "spec_bench"
BENCH_HEADING = "## Speed on this machine (`kolibri bench`)"
CHAT_HEADING = "## Chat goldens (goldens/smollm2-135m-instruct/chat.jsonl)"
TREES_HEADING = "## Chains vs trees (chat goldens)"
LLAMACPP_HEADING = "## llama.cpp's types at their upstream defaults (chat goldens, simulated)"
SPEC_BENCH_HEADING = "## Spec-Bench prompts (simulated, and measured on 2 per category)"
SAMPLED_HEADING = "## Greedy vs sampled (T = 0.7)"
# Spec-Bench Leaderboard.md, prompt lookup decoding (Vicuna-7B, greedy, A100): speedup per task
PUBLISHED = {"mt_bench": 1.60, "translation": 1.06, "summarization": 2.66, "qa": 1.19,
             "math_reasoning": 1.62, "rag": 1.86}
PUBLISHED_MEAN_ACCEPTED = 1.75
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")
SPEC_BENCH_CATEGORIES = (*MT_BENCH, "translation", "summarization", "qa", "math_reasoning",
                         "rag")


def spec_bench_questions() -> Path:
    """Spec-Bench's question.jsonl: $KOLIBRI_SPEC_BENCH, else shared/datasets/ beside the repo
    (a worktree sits one level deeper than the main checkout)."""
    if os.environ.get("KOLIBRI_SPEC_BENCH"):
        return Path(os.environ["KOLIBRI_SPEC_BENCH"])
    rel = Path("shared/datasets/spec_bench/question.jsonl")
    return next((d / rel for d in ROOT.parents if (d / rel).exists()), ROOT.parent / rel)


def kolibri(*args: str) -> str:
    print("+ kolibri", " ".join(args), file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "kolibri_cli", *args]
    return subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout


def _cpu() -> str:
    """The CPU's model name: every figure below is this CPU's."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), platform.machine())


def _provenance() -> str:
    """Commit, CPU and 1-minute load average: the figures swing with the shared host's load."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
    return (f"commit {commit or '?'} on {_cpu()} ({os.cpu_count()} cores), 1-minute load "
            f"average {os.getloadavg()[0]:.1f}")


def measure_costs() -> dict:
    """One `kolibri bench --k 8` run, stored: its c(1..9) prices every later chunk's drafts
    (15 repeats: at the default 5, c(5) swung 2.0-2.3 between back-to-back runs)."""
    when, start = _provenance(), time.monotonic()
    bench = json.loads(kolibri("bench", "--k", "8", "--repeats", "15", "--json"))
    print(f"costs: {(time.monotonic() - start) / 60:.1f} min", file=sys.stderr)
    stored = {"command": "kolibri bench --k 8 --repeats 15 --json", "when": when,
              "bench": bench}
    write_text_atomic(COSTS_FILE, json.dumps(stored, indent=1) + "\n")
    return stored


def stored_costs() -> dict:
    return json.loads(COSTS_FILE.read_text()) if COSTS_FILE.exists() else measure_costs()


def costs_arg(stored: dict) -> str:
    """c(1..9) as `--costs` takes them."""
    return ",".join(f"{stored['bench']['costs'][str(n)]:.3f}" for n in range(1, 10))


def costs_note(stored: dict) -> str:
    return (f"c(n) for the modelled speedups and the adaptive proposers: `{stored['command']}` "
            f"at {stored['when']} (build/feasibility-bench.json, shared by every chunk): "
            f"{costs_arg(stored)}.")


def bench_section(stored: dict) -> str:
    b = stored["bench"]
    costs = ", ".join(f"c({n}) = {c:.2f}" for n, c in b["costs"].items())
    storage = ", ".join(f"{t} x{n}" for t, n in b["storage"].items())
    return "\n".join([
        f"`{stored['command']}` at {stored['when']} when it started; the same run's "
        "c(n) prices every section regenerated after it (each section names the c(n) it used).\n",
        f"- read bandwidth {b['bandwidth_gb_s']:.1f} GB/s; {b['bytes_per_token'] / 1e6:.0f} MB of "
        f"weights per token as stored ({storage}): bound {b['bound_tokens_per_s']:.1f} tok/s",
        f"- plain decode {b['plain_tokens_per_s']:.1f} tok/s = "
        f"{b['fraction_of_bound']:.0%} of the bound ({b['threads']} threads)",
        f"- bench chain (seed {b['chain_seed']}, k 8, {b['plain_steps']} plain steps, "
        f"{b['verify_passes']} verify passes, {b['drafts_accepted']}/{b['drafts_proposed']} "
        f"drafts accepted): spec {b['spec_tokens_per_s']:.1f} tok/s = "
        f"**{b['spec_speedup']:.2f}x** plain (pass ratio {b['pass_ratio']:.2f})",
        f"- verify cost at context 100: {costs}\n",
    ])


CHAINS = ["vllm", "llamacpp-simple", "llamacpp-map-k", "llamacpp-map-k4v", "llamacpp-mod",
          "llamacpp-cache", "suffix", "adaptive"]
TREES = ["suffix-tree", "sglang", "adaptive-tree"]
CHAIN_SWEEP = ("1,2,3,5,8", "1-2,1-3,1-4,2-4,3-5,5-5")
TREE_SWEEP = ("2,4,8,12,16", "1-4,1-12")


# The sections of the probe's Markdown report kept here; the whole report (per golden, each
# measured configuration's figures) is build/feasibility-chat.md.
CHAT_KEEP = ("Proposers compared", "Sweep", "Totals", "Acceptance per draft position", "Guard")


def chat_section(stored: dict) -> str:
    """The chain proposers' report on the chat goldens; its JSON is kept for `trees`."""
    costs = costs_arg(stored)
    out = kolibri("probe", "probes/feasibility.toml", "--costs", costs, "--json")
    write_text_atomic(CHAT_JSON, json.dumps({"costs": costs, "probe": json.loads(out)}) + "\n")
    text = (BUILD / "feasibility-chat.md").read_text()
    body = text.split("\n", 1)[1].replace("../docs/feasibility.png", "feasibility.png")
    body = "\n".join(line for line in body.split("\n") if not line.startswith("Regenerate with"))
    intro, *sections = body.split("\n## ")
    kept = [sec for sec in sections if sec.startswith(CHAT_KEEP)]
    dropped = [sec.split("\n", 1)[0] for sec in sections if not sec.startswith(CHAT_KEEP)]
    print(f"chat: left in build/feasibility-chat.md: {'; '.join(dropped)}", file=sys.stderr)
    return "\n".join([
        costs_note(stored) + "\n", intro.strip("\n") + "\n",
        *("### " + sec.rstrip("\n") + "\n" for sec in kept),
        "Per golden, and each measured configuration's figures: build/feasibility-chat.md, "
        "written by the same command.\n",
    ])


def chat_probe(stored: dict) -> dict | None:
    """The chat chunk's JSON, if it was priced with the stored c(n)."""
    if not CHAT_JSON.exists():
        return None
    kept = json.loads(CHAT_JSON.read_text())
    return kept["probe"] if kept["costs"] == costs_arg(stored) else None


def _best(doc: dict) -> list[dict]:
    """Each proposer's run at its best modelled speedup, with its measured figures."""
    runs = {(r["proposer"], r["k"], tuple(r["window"])): r for r in doc["runs"]}
    return [runs[(c["proposer"], c["k"], tuple(c["window"]))] | {"comparison": c}
            for c in doc["comparison"]]


def _row(run: dict, kind: str) -> str:
    t, c, m = run["total"], run["comparison"], run["measured"] or {}
    per_pass = t["drafts_proposed"] / t["verify_passes"] if t["verify_passes"] else 0.0
    measured = f"{m['speedup']:.2f}x" if m else "not run"
    predicted = f"{m['predicted_speedup']:.2f}x" if m.get("predicted_speedup") else ""
    proposer_us = f"{m['proposer_s_per_pass'] * 1e6:.0f}" if m else ""
    return (f"| {run['proposer']} | {kind} | {run['k']} | {run['window'][0]}-{run['window'][1]} "
            f"| {t['ratio']:.2f}x | {per_pass:.2f} | {c['mean_acceptance_length'] or 0:.2f} | "
            f"{c['modelled_speedup']:.2f}x | {measured} | {predicted} | {proposer_us} |")


def trees_section(stored: dict, chains: dict) -> str:
    """The tree proposers beside the chain proposers, every one at its best setting."""
    trees = json.loads(kolibri("probe", "probes/feasibility-trees.toml", "--costs",
                               costs_arg(stored), "--json"))
    rows = [_row(r, "chain") for r in _best(chains)] + [_row(r, "tree") for r in _best(trees)]
    best = {kind: max((r for r in _best(doc) if r["measured"]), default=None,
                      key=lambda r: r["measured"]["speedup"])
            for kind, doc in (("chain", chains), ("tree", trees))}
    verdict = ""
    if best["chain"] and best["tree"]:
        ch, tr = best["chain"], best["tree"]
        verdict = (f"Measured in this run: the best tree proposer, {tr['proposer']} "
                   f"({tr['measured']['speedup']:.2f}x), against the best chain proposer, "
                   f"{ch['proposer']} ({ch['measured']['speedup']:.2f}x).\n")
    return "\n".join([
        costs_note(stored) + "\n",
        "Every proposer at its best setting by modelled speedup (chains: k x window over "
        f"{CHAIN_SWEEP[0]} x {CHAIN_SWEEP[1]}; trees: k = tree nodes over {TREE_SWEEP[0]}, "
        f"window {TREE_SWEEP[1]}), each measured with the model (plain vs spec in the same run, "
        "trees verified in one forward pass with tree attention). Drafts per pass = tokens, or "
        "tree nodes: what a pass verifies and what c(n) prices. Proposer time is per pass, in "
        "us, measured in the spec runs (included in the prediction, not in the modelled "
        "column).\n",
        "| proposer | kind | k | window | ratio | drafts / pass | mean acc. len | modelled "
        "| measured | predicted (measured c(n)) | proposer us / pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "", verdict,
    ])


def llamacpp_defaults_section(stored: dict) -> str:
    """llama.cpp's types as llama-server runs them by default, on the chat goldens."""
    doc = json.loads(kolibri("probe", "--proposer", ",".join(CHAINS[1:6]), "--costs",
                             costs_arg(stored), "--json"))
    rows = [f"| {r['proposer']} | {r['k']} | {r['window'][1]} | {r['total']['ratio']:.2f}x | "
            f"{r['total']['drafts_proposed']} | {r['total']['drafts_accepted']} | "
            f"{r['modelled_speedup']:.2f}x |" for r in doc["runs"]]
    return "\n".join([
        costs_note(stored) + "\n",
        "As `llama-server --spec-type ngram-*` runs them without size options (m = k, n = window "
        "max; ngram-mod's n-min 48, ngram-cache's 8 tokens). Long keys rarely recur in 128-token "
        "chat answers, so these draft little here; the sweep above finds their better settings. "
        "The counts are the ones llama-server itself reports for these settings "
        "(`tests/test_llama_server_types.py`).\n",
        "| type | m (k) | n | ratio | drafts | accepted | modelled speedup |",
        "|---|---|---|---|---|---|---|", *rows, "",
    ])


def record_spec_bench(categories=SPEC_BENCH_CATEGORIES) -> None:
    """Greedy chains for 10 Spec-Bench prompts per category, one file per category (each written
    whole by `goldens record`), so a run cut short keeps what it finished."""
    SPEC_BENCH_DIR.mkdir(parents=True, exist_ok=True)
    for cat in categories:
        out = SPEC_BENCH_DIR / f"{cat}.jsonl"
        if out.exists():
            print(f"spec-bench-record: {cat} already recorded ({out})", file=sys.stderr)
            continue
        start = time.monotonic()
        kolibri("goldens", "record", "--prompts", str(spec_bench_questions()), "--category", cat,
                "--per-category", "10", "--greedy", "--engine", "kolibri", "--max-tokens",
                "128", "-o", str(out))
        print(f"spec-bench-record: {cat} in {time.monotonic() - start:.0f} s", file=sys.stderr)


def spec_bench_goldens() -> Path:
    """The recorded categories in one file, in Spec-Bench's order (recording what is missing)."""
    record_spec_bench()
    out = BUILD / "spec_bench.jsonl"
    parts = [(SPEC_BENCH_DIR / f"{cat}.jsonl").read_text() for cat in SPEC_BENCH_CATEGORIES]
    write_text_atomic(out, "".join(parts))
    return out


def probe_categories(goldens: Path, k: int, window: str) -> dict:
    doc = json.loads(kolibri("probe", "--goldens", str(goldens), "--k", str(k), "--window",
                             window, "--by-category", "--json"))
    run = doc["runs"][0]
    cats = run["categories"]
    mt = [cats[c] for c in MT_BENCH if c in cats]
    cats["mt_bench"] = {key: sum(c[key] for c in mt) for key in
                        ("plain_steps", "verify_passes", "drafts_accepted", "passes_with_drafts")}
    cats["overall"] = run["total"]
    return cats


def _ratio(c: dict) -> str:
    return f"{c['plain_steps'] / c['verify_passes']:.2f}x"


def _mean_len(c: dict) -> str:
    return f"{1 + c['drafts_accepted'] / c['passes_with_drafts']:.2f}" if c[
        "passes_with_drafts"] else "n/a"


def spec_bench_measured_goldens(goldens: Path, per_category: int = 2) -> Path:
    """The first `per_category` Spec-Bench chains of each category (for the measured runs)."""
    out, kept, seen = BUILD / "spec_bench_measured.jsonl", [], {}
    for line in goldens.read_text().splitlines():
        cat = json.loads(line)["category"]
        seen[cat] = seen.get(cat, 0) + 1
        if seen[cat] <= per_category:
            kept.append(line)
    write_text_atomic(out, "".join(line + "\n" for line in kept))
    return out


def spec_bench_proposers(goldens: Path, costs: str) -> str:
    """Every proposer's best setting on the Spec-Bench chains (simulated), and the best chain and
    tree proposer measured on a few prompts per category."""
    docs = {kind: json.loads(kolibri("probe", "--goldens", str(goldens), "--proposer",
                                     ",".join(names), "--k", sweep[0], "--window", sweep[1],
                                     "--costs", costs, "--json"))
            for kind, names, sweep in (("chain", CHAINS, CHAIN_SWEEP),
                                       ("tree", TREES, TREE_SWEEP))}
    rows = [_row(r, kind) for kind, doc in docs.items() for r in _best(doc)]
    top = {kind: max(_best(doc), key=lambda r: r["comparison"]["modelled_speedup"])
           for kind, doc in docs.items()}
    subset = spec_bench_measured_goldens(goldens)
    # one run per proposer, at its own best setting (a cross product of the two settings would
    # let the subset pick another one)
    measured_rows = [_row(_best(json.loads(kolibri(
        "probe", "--goldens", str(subset), "--proposer", r["proposer"], "--k", str(r["k"]),
        "--window", f"{r['window'][0]}-{r['window'][1]}", "--costs", costs, "--measure",
        "--json")))[0], kind) for kind, r in top.items()]
    n = len(subset.read_text().splitlines())
    header = ("| proposer | kind | k | window | ratio | drafts / pass | mean acc. len | modelled "
              "| measured | predicted (measured c(n)) | proposer us / pass |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")
    return "\n".join([
        "### Every proposer on the Spec-Bench chains (simulated)\n",
        "Each at its best setting by modelled speedup over the same sweeps as the chat goldens.\n",
        header, *rows, "",
        f"### Measured: the best chain and the best tree proposer ({n} Spec-Bench prompts, the "
        "first 2 of each category)\n",
        header, *measured_rows, "",
    ])


def spec_bench_section(stored: dict) -> str:
    goldens = spec_bench_goldens()
    ours = probe_categories(goldens, 5, "1-4")
    pld = probe_categories(goldens, 10, "1-3")
    rows = ["| category | prompts | kolibri k=5 1-4: ratio | mean acc. len | "
            "PLD-like k=10 1-3: ratio | mean acc. len | Spec-Bench PLD speedup |",
            "|---|---|---|---|---|---|---|"]
    counts = {}
    for line in goldens.read_text().splitlines():
        cat = json.loads(line)["category"]
        counts[cat] = counts.get(cat, 0) + 1
    counts["mt_bench"] = sum(counts.get(c, 0) for c in MT_BENCH)
    counts["overall"] = sum(v for c, v in counts.items() if c != "mt_bench")
    order = [*MT_BENCH, "mt_bench", "translation", "summarization", "qa", "math_reasoning",
             "rag", "overall"]
    for cat in order:
        if cat not in ours:
            continue
        pub = PUBLISHED.get(cat)
        published = f"{pub:.2f}x" if pub else ""
        if cat == "overall":
            published = f"mean accepted tokens {PUBLISHED_MEAN_ACCEPTED}"
        name = f"**{cat}**" if cat in ("mt_bench", "overall") else cat
        rows.append(f"| {name} | {counts.get(cat, '')} | {_ratio(ours[cat])} | "
                    f"{_mean_len(ours[cat])} | {_ratio(pld[cat])} | {_mean_len(pld[cat])} | "
                    f"{published} |")
    return "\n".join([
        "The first turn of 10 prompts per Spec-Bench category, chat template, 128 new tokens, "
        "greedy chains recorded with kolibri (they stay in build/, Spec-Bench is not copied "
        "into the repo). Ratio = plain steps / verify passes; mean acceptance length = 1 + "
        "accepted / passes with drafts (vLLM). Spec-Bench's published prompt lookup figures are "
        "for Vicuna-7B on an A100 — compare the shape across tasks, not absolute numbers; "
        "their mean accepted tokens per step is tokens per verify pass, our ratio column. "
        "`mt_bench` sums its eight categories. SmolLM2-135M often copies the German source "
        "instead of translating it (see `output_ids` in build/spec_bench.jsonl), which is why its "
        "translation chains draft so well, unlike Vicuna-7B's.\n",
        *rows, "", costs_note(stored) + "\n", spec_bench_proposers(goldens, costs_arg(stored)),
    ])


def sampled_goldens() -> Path:
    """Recorded once, kept in build/ for reruns (the chains depend only on the model)."""
    out = BUILD / "chat-t0.7.jsonl"
    if not out.exists():
        kolibri("goldens", "record", "--prompts", str(CHAT_PROMPTS), "--engine", "kolibri",
                "--temperature", "0.7", "--seed", "0", "--seeds", "3", "--max-tokens", "128",
                "-o", str(out))
    return out


def _probe_run(goldens: Path, costs: str) -> dict:
    doc = json.loads(kolibri("probe", "--goldens", str(goldens), "--k", "5", "--window", "1-4",
                             "--costs", costs, "--by-category", "--json"))
    return doc["runs"][0] | {"comparison": doc["comparison"][0]}


def _pm(spread: dict, fmt) -> str:
    return f"{fmt(spread['mean'])} ± {fmt(spread['sd'])}" if spread["mean"] is not None else "n/a"


def sampled_section(stored: dict) -> str:
    costs = costs_arg(stored)
    greedy, sampled = _probe_run(CHAT_GOLDENS, costs), _probe_run(sampled_goldens(), costs)
    pct, ratio = (lambda v: f"{100 * v:.1f}%"), (lambda v: f"{v:.2f}x")
    rows = ["| category | acceptance greedy | acceptance T=0.7 | ratio greedy | ratio T=0.7 | "
            "modelled speedup greedy | modelled speedup T=0.7 |", "|---|---|---|---|---|---|---|"]
    cats = {"all": greedy["total"] | {"modelled_speedup": greedy["modelled_speedup"]}}
    for name, c in greedy["categories"].items():
        cats[name] = c | {"modelled_speedup": greedy["comparison"]["categories"][name][
            "modelled_speedup"]}
    for name, g in cats.items():
        s = sampled["seeds"][name]
        rows.append(f"| {'**all**' if name == 'all' else name} | {pct(g['acceptance_rate'])} | "
                    f"{_pm(s['acceptance_rate'], pct)} | {ratio(g['ratio'])} | "
                    f"{_pm(s['ratio'], ratio)} | {ratio(g['modelled_speedup'])} | "
                    f"{_pm(s['modelled_speedup'], ratio)} |")
    drop = 1 - sampled["seeds"]["all"]["acceptance_rate"]["mean"] / cats["all"]["acceptance_rate"]
    return "\n".join([
        "The 18 chat prompts, 128 new tokens, vLLM's rule k=5 window 1-4, simulated (exact for "
        "sampled chains too: kolibri's speculative run reproduces the plain sampled chain, so "
        "replaying the proposer over it gives the real counts). Greedy: the shipped chat goldens. "
        "T = 0.7: `kolibri goldens record --engine kolibri --temperature 0.7 --seed 0 --seeds 3` "
        "(build/chat-t0.7.jsonl), mean ± standard deviation over the 3 seeds.\n",
        costs_note(stored) + "\n",
        *rows, "",
        f"At T = 0.7 the acceptance of n-gram drafts falls by {drop:.0%} relative to greedy on "
        "this model (overall).\n",
    ])


HEADER = ("# Feasibility: n-gram speculation for SmolLM2-135M-Instruct on this CPU\n\n"
          "Regenerate with `python probes/feasibility.py` (needs `pip install -e '.[plot]'`; it "
          "takes about 35 minutes on 2 cores), or one section at a time with `python "
          "probes/feasibility.py CHUNK` (`--help` lists them; each fits a 15-minute window). "
          "Every figure below is printed by the kolibri commands that script runs; only "
          "Spec-Bench's published figures are quoted (from its Leaderboard.md). Each section "
          "names the command, the commit and CPU of its run, and the c(n) it used.\n")


def _trees(stored: dict) -> str:
    chains = chat_probe(stored)
    if chains is None:
        run_chunk("chat", stored)
        chains = chat_probe(stored)
    return trees_section(stored, chains)


# chunk name -> (heading, section body from the stored bench run), in the doc's order
CHUNKS = {
    "bench": (BENCH_HEADING, bench_section),
    "chat": (CHAT_HEADING, chat_section),
    "trees": (TREES_HEADING, _trees),
    "llamacpp": (LLAMACPP_HEADING, llamacpp_defaults_section),
    "spec-bench": (SPEC_BENCH_HEADING, spec_bench_section),
    "sampled": (SAMPLED_HEADING, sampled_section),
}


def run_chunk(name: str, stored: dict) -> None:
    heading, make = CHUNKS[name]
    when, start = _provenance(), time.monotonic()
    body = make(stored)
    took = (time.monotonic() - start) / 60
    print(f"{name}: {took:.1f} min", file=sys.stderr)
    stamp = (f"_Regenerated by `python probes/feasibility.py {name}` at {when}; took "
             f"{took:.1f} min._\n")
    update_section(heading, f"{heading}\n\n{stamp}\n{body}")


def update_section(heading: str, section: str) -> None:
    """Replace only the section under `heading` in docs/feasibility.md (and the header); a
    missing one goes before the first section that follows it in CHUNKS, else at the end.
    Sections under other headings (hand-written ones too) stay as they are."""
    text = DOC.read_text() if DOC.exists() else ""
    text = HEADER + "\n" + text[text.find("\n## ") + 1 :] if "\n## " in text else HEADER
    if heading in text:
        head, rest = text.split(heading, 1)
        tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        return _write_doc(head + section.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))
    headings = [h for h, _ in CHUNKS.values()]
    later = [h for h in headings[headings.index(heading) + 1 :] if h in text]
    if later:
        head, tail = text.split(later[0], 1)
        return _write_doc(head + section.rstrip("\n") + "\n\n" + later[0] + tail)
    _write_doc(text.rstrip("\n") + "\n\n" + section)


def _write_doc(text: str) -> None:
    write_text_atomic(DOC, text)
    print("wrote docs/feasibility.md", file=sys.stderr)


def main() -> None:
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        return print(__doc__)
    BUILD.mkdir(exist_ok=True)
    if args[:1] == ["spec-bench-record"]:
        unknown = set(args[1:]) - set(SPEC_BENCH_CATEGORIES)
        if unknown:
            sys.exit(f"error: unknown Spec-Bench categories {sorted(unknown)}; "
                     f"known: {', '.join(SPEC_BENCH_CATEGORIES)}")
        return record_spec_bench(tuple(args[1:]) or SPEC_BENCH_CATEGORIES)
    unknown = [a for a in args if a not in CHUNKS and a != "costs"]
    if unknown:
        sys.exit(f"error: unknown chunk {unknown[0]!r}; "
                 f"one of costs, {', '.join(CHUNKS)}, spec-bench-record (see --help)")
    stored = measure_costs() if not args or "costs" in args else stored_costs()
    for name in [n for n in CHUNKS if not args or n in args]:
        run_chunk(name, stored)


if __name__ == "__main__":
    main()
