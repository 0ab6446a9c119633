"""`kolibri serve` against llama.cpp's llama-server: requests/s and tokens/s on the same GGUF and
the same prompts (the chat goldens' prompt ids, their recorded max_tokens, greedy), both driven
by the same client (the official `openai` package, /v1/completions with the prompt as token ids),
in one run — the figures in docs/serve.md.

    python probes/serve_bench.py [--rounds 3] [--threads 2] [--clients 1] [--limit N] [--json]

Servers: `kolibri serve` with speculation (the guard, its default) and `--no-spec`, and a
llama-server (`kolibri-cli[llamacpp]`) started as kolibri starts it (engines.launch: --no-repack,
one slot, the same threads). Each round sends every prompt to each server in turn (the order rotates
between rounds); a server's figures are over its rounds' summed wall time, as the client sees it
(HTTP, prefill and decoding; tokens = the answers' completion_tokens, eos included). Each server
generates its own chain (llama.cpp's numerics differ from kolibri's float32 kernel), so tokens/s
is the comparable figure; kolibri's two servers must return the same ids, which is checked.
Run it alone on the machine; progress on stderr.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tally:
    """One server's rounds."""

    name: str
    url: str
    seconds: list[float] = field(default_factory=list)  # wall time of each round
    tokens: list[int] = field(default_factory=list)  # completion tokens of each round
    chains: dict[str, list[int]] = field(default_factory=dict)  # golden id -> ids (kolibri)

    def figures(self, requests: int) -> dict:
        s, t = sum(self.seconds), sum(self.tokens)
        return {"server": self.name, "rounds": len(self.seconds), "requests": requests,
                "requests_per_s": requests * len(self.seconds) / s, "tokens_per_s": t / s,
                "tokens_per_round": t / len(self.tokens),
                "tokens_per_s_by_round": [round(n / x, 2) for n, x in
                                          zip(self.tokens, self.seconds, strict=True)]}


class KolibriServer:
    """`kolibri serve` in a process of its own, on any free port."""

    def __init__(self, *args: str, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kolibri_cli", "serve", "--port", "0", "--threads",
             str(threads), "--max-queue", "64", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if line.startswith("kolibri serve: http://"):
                self.url = line.split()[2]
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return
        raise SystemExit(f"kolibri serve did not start (exit {self.proc.wait()})")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def requests_of(goldens) -> list[tuple[str, list[int], int]]:
    """(id, prompt ids, max_tokens) per golden, as recorded."""
    return [(str(g.id), g.prompt_ids, int(g.reference.get("max_tokens") or len(g.output_ids)))
            for g in goldens]


def run_round(tally: Tally, work, clients: int, kolibri: bool) -> None:
    import openai

    client = openai.OpenAI(base_url=tally.url + "/v1", api_key="none", max_retries=0,
                           timeout=3600)
    model = client.models.list().data[0].id

    def one(item):
        gid, ids, n = item
        extra = {"return_token_ids": True} if kolibri else {}
        answer = client.completions.create(model=model, prompt=ids, max_tokens=n,
                                           temperature=0.0, extra_body=extra)
        if kolibri:
            tally.chains.setdefault(gid, answer.choices[0].model_extra["token_ids"])
        return answer.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, work))
    tally.seconds.append(time.perf_counter() - t0)
    tally.tokens.append(tokens)


def cpu_name() -> str:
    """The CPU's model name and its widest vector extension (a figure's context)."""
    name, flags = platform.processor() or "unknown CPU", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} ({widest})"


def main() -> None:
    from kolibri_cli.engines.launch import LlamaServer, ServerSpec
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.store.cache import gguf_file
    from kolibri_cli.store.models import open_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goldens", type=Path, default=DEFAULT_CHAT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--clients", type=int, default=1, help="concurrent client threads")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--llama-flag", action="append", default=[], metavar="FLAG",
                    help="an extra llama-server flag (repeatable), e.g. --llama-flag=--poll=0")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    work = requests_of(load_goldens(a.goldens))[: a.limit]
    load = [os.getloadavg()[0]]
    gguf = gguf_file(open_model(None, weights=False).path)
    print(f"{len(work)} prompts, {a.rounds} rounds, {a.threads} threads, {a.clients} client(s); "
          "starting servers", file=sys.stderr)
    spec, plain = (KolibriServer(*flags, threads=a.threads) for flags in ((), ("--no-spec",)))
    with LlamaServer(ServerSpec(gguf, a.threads, args=tuple(a.llama_flag))) as llama:
        tallies = [Tally("kolibri serve", spec.url), Tally("kolibri serve --no-spec", plain.url),
                   Tally("llama-server", llama.url)]
        for tally in tallies:  # warm-up: one request each, not timed
            run_round(Tally(tally.name, tally.url), work[:1], 1, False)
        for r in range(a.rounds):
            for tally in tallies[r % 3:] + tallies[: r % 3]:
                run_round(tally, work, a.clients, tally.name.startswith("kolibri"))
                print(f"round {r + 1}: {tally.name} {tally.tokens[-1] / tally.seconds[-1]:.1f} "
                      "tok/s", file=sys.stderr)
        version = llama.version()
    for server in (spec, plain):
        server.stop()
    report(tallies, work, a, gguf, version, [*load, os.getloadavg()[0]])


def report(tallies: list[Tally], work, a, gguf: Path, version: str, load: list[float]) -> None:
    rows = [t.figures(len(work)) for t in tallies]
    base = rows[-1]["tokens_per_s"]
    for row in rows:
        row["tokens_per_s_vs_llama_server"] = row["tokens_per_s"] / base
    same = tallies[0].chains == tallies[1].chains
    doc = {"cpu": cpu_name(), "threads": a.threads, "clients": a.clients, "gguf": str(gguf),
           "llama_server": version, "prompts": len(work), "load_average": load,
           "kolibri_spec_ids_equal_plain": same,
           "servers": rows}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{doc['cpu']}, {a.threads} threads, {a.clients} client(s), {len(work)} prompts x "
          f"{a.rounds} rounds; {version}; load average {load[0]:.1f} -> {load[1]:.1f}")
    print(f"{'server':26s} {'req/s':>7s} {'tok/s':>7s} {'vs llama':>9s}  tok/s by round")
    for row in rows:
        print(f"{row['server']:26s} {row['requests_per_s']:7.3f} {row['tokens_per_s']:7.1f} "
              f"{row['tokens_per_s_vs_llama_server']:8.2f}x  {row['tokens_per_s_by_round']}")
    print(f"kolibri serve ids with speculation == without: {same}")


if __name__ == "__main__":
    main()
