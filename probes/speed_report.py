"""Regenerate the measured section of docs/bench.md: kolibri against its own float32 kernel of an
earlier commit and against llama.cpp, on the same machine in one run.

    .venv/bin/python probes/speed_report.py --baseline 9c0ce10 [--rounds 3] [--repeats 5]
        [--big llama8b.gguf] [--peer-bin PATH]

1. `kolibri bench --json --peer llama.cpp` (this checkout) and `kolibri bench --json` of the
   baseline commit (its float32 kernel; checked out into build/, its own KOLIBRI_HOME), run
   alternately `--rounds` times: medians of the rounds.
2. Peak RSS of `kolibri generate -n 64` on the default model, both checkouts.
3. With --big: the GGUF imported (its own KOLIBRI_HOME in build/), peak RSS of a 16-token
   generate, and `kolibri bench --peer llama.cpp --prefill 0` on it (1 repeat, k 1).
The section between the markers in docs/bench.md is replaced; the JSON goes to build/.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
DOC = ROOT / "docs/bench.md"
BEGIN, END = "<!-- speed_report.py: begin -->", "<!-- speed_report.py: end -->"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def kolibri(src: Path, home: Path, *args: str) -> tuple[str, int]:
    """(stdout, peak RSS bytes of that process) of `python -m kolibri_cli ARGS` run from
    checkout `src`."""
    env = os.environ | {"KOLIBRI_HOME": str(home), "PYTHONPATH": str(src)}
    print("+", src.name, "kolibri", " ".join(args), file=sys.stderr, flush=True)
    proc = subprocess.Popen([sys.executable, "-m", "kolibri_cli", *args], cwd=src, env=env,
                            stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    if status != 0:
        raise SystemExit(f"kolibri {' '.join(args)} failed ({status})")
    return out, 1024 * usage.ru_maxrss


def checkout(rev: str) -> Path:
    dest = BUILD / f"baseline-{rev}"
    if not dest.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(dest), rev], cwd=ROOT,
                       check=True)
    return dest


def rss_of_generate(src: Path, home: Path, n: int) -> int:
    """Peak RSS of one generate in a fresh process, after one that pulls the model and compiles
    (a first run's figure is the pull's, not a user's steady state)."""
    kolibri(src, home, "generate", "-n", "1", "--json", PROMPT)
    return kolibri(src, home, "generate", "-n", str(n), "--json", PROMPT)[1]


def _tok(figures: dict, key: str) -> str:
    """A peer figure, or "failed" where that llama.cpp run did not finish."""
    return f"{figures[key]:.1f}" if key in figures else "failed"


def median_of(runs: list[dict], *keys) -> float:
    values = []
    for r in runs:
        for k in keys:
            r = r[k]
        values.append(r)
    return statistics.median(values)


def default_model(baseline: Path, rounds: int, repeats: int, peer_bin: list[str]) -> dict:
    new_home, old_home = BUILD / "home-new", BUILD / "home-baseline"
    rss = {"new": rss_of_generate(ROOT, new_home, 64)}
    rss["baseline"] = rss_of_generate(baseline, old_home, 64)
    new, old, load = [], [], [os.getloadavg()[0]]
    for _ in range(rounds):  # alternate: machine noise hits both alike
        new.append(json.loads(kolibri(ROOT, new_home, "bench", "--json", "--repeats",
                                      str(repeats), "--peer", "llama.cpp", *peer_bin)[0]))
        old.append(json.loads(kolibri(baseline, old_home, "bench", "--json", "--repeats",
                                      str(repeats))[0]))
        load.append(os.getloadavg()[0])
    return {"new": new, "baseline": old, "rss": rss, "load": load}


def big_model(gguf: Path, peer_bin: list[str]) -> dict:
    home = BUILD / "home-big"
    name = gguf.name.removesuffix(".gguf")
    if not (home / "models" / name / "kolibri.json").is_file():
        kolibri(ROOT, home, "model", "import", str(gguf), "--name", name)
    rss = kolibri(ROOT, home, "generate", "-m", name, "-n", "16", "--json", PROMPT)[1]
    bench = json.loads(kolibri(ROOT, home, "bench", "-m", name, "--json", "--peer", "llama.cpp",
                               *peer_bin, "--prefill", "0", "--repeats", "1", "--k", "1")[0])
    return {"name": name, "rss": rss, "bench": bench}


def section(d: dict, big: dict | None, rev: str) -> str:
    new, old = d["new"], d["baseline"]
    m = lambda runs, *k: median_of(runs, *k)  # noqa: E731
    plain, base = m(new, "plain_tokens_per_s"), m(old, "plain_tokens_per_s")
    n = max(int(c) for c in new[0]["costs"])
    peer = new[-1]["peer"]
    lines = [BEGIN, "", f"Measured by `python probes/speed_report.py --baseline {rev}` "
             f"({len(new)} alternating rounds, medians; {new[0]['threads']} threads; peer: "
             f"llama.cpp {peer['version']}, llama-bench on the same GGUF, last round; 1-minute "
             f"load average {', '.join(f'{x:.1f}' for x in d['load'])} on 2 cores, "
             "before and after each round).", "",
             "| figure | kolibri | baseline (float32 kernel) | llama.cpp | llama.cpp --repack 0 |",
             "|---|---|---|---|---|"]
    dec = peer["decode_tokens_per_s"]
    lines.append(f"| plain decode tok/s | {plain:.1f} | {base:.1f} | {_tok(dec, 'repack')} | "
                 f"{_tok(dec, 'no repack')} |")
    lines.append(f"| spec decode tok/s (bench chain) | {m(new, 'spec_tokens_per_s'):.1f} | "
                 f"{m(old, 'spec_tokens_per_s'):.1f} | | |")
    lines.append(f"| c({n}) | {m(new, 'costs', str(n)):.2f} | {m(old, 'costs', str(n)):.2f} | | "
                 f"{peer['costs'].get(str(n), 0):.2f} |")
    pre = peer["prefill_tokens_per_s"]
    lines.append(f"| prefill {new[0]['prefill_tokens']} tok/s | "
                 f"{m(new, 'prefill_tokens_per_s'):.1f} | | {_tok(pre, 'repack')} | "
                 f"{_tok(pre, 'no repack')} |")
    lines.append(f"| weights per token | {new[0]['bytes_per_token'] / 1e6:.0f} MB | "
                 f"{old[0]['bytes_per_token'] / 1e6:.0f} MB | | |")
    lines.append(f"| bandwidth bound tok/s (read {m(new, 'bandwidth_gb_s'):.1f} GB/s) | "
                 f"{m(new, 'bound_tokens_per_s'):.1f} | {m(old, 'bound_tokens_per_s'):.1f} | | |")
    lines.append(f"| peak RSS, generate -n 64 | {d['rss']['new'] / 1e6:.0f} MB | "
                 f"{d['rss']['baseline'] / 1e6:.0f} MB | | |")
    lines += ["", f"Ratios: plain decode {plain / base:.2f}x the baseline, "
              + ", ".join(f"{k} {statistics.median(r['peer_ratios'][k] for r in new):.2f}x"
                          for k in new[0]["peer_ratios"]) + "."]
    failures = peer["failures"]
    if failures:
        lines.append("llama.cpp runs that failed: " + "; ".join(f"{k}: {v}"
                                                               for k, v in failures.items()))
    if big:
        b, p = big["bench"], big["bench"]["peer"]
        lines += ["", f"Llama-3-8B-shaped Q4_K_M GGUF of random blocks "
                  f"(`probes/synthetic_gguf.py`, {big['name']}): "
                  f"{b['bytes_per_token'] / 1e9:.2f} GB per token, peak RSS of a 16-token "
                  f"generate {big['rss'] / 1e9:.2f} GB; plain decode "
                  f"{b['plain_tokens_per_s']:.2f} tok/s, llama.cpp "
                  + ", ".join(f"{k} {v:.2f} tok/s" for k, v in p["decode_tokens_per_s"].items())
                  + "."]
    return "\n".join([*lines, "", END])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="git revision with the float32 kernel")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="kolibri bench --repeats")
    ap.add_argument("--big", type=Path, help="a big GGUF (probes/synthetic_gguf.py)")
    ap.add_argument("--peer-bin", help="llama-bench (default: kolibri bench's search)")
    args = ap.parse_args()
    BUILD.mkdir(exist_ok=True)
    peer_bin = ["--peer-bin", args.peer_bin] if args.peer_bin else []
    data = default_model(checkout(args.baseline), args.rounds, args.repeats, peer_bin)
    big = big_model(args.big, peer_bin) if args.big else None
    (BUILD / "speed_report.json").write_text(json.dumps({"default": data, "big": big}, indent=1))
    text = DOC.read_text()
    new = section(data, big, args.baseline)
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + new + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n## Measured\n\n" + new + "\n"
    DOC.write_text(text)
    print(new)


if __name__ == "__main__":
    main()
