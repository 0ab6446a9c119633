"""Speculation under load, measured on llama-server against kolibri's step model
(probe/load.py) — the figures in docs/load.md.

    python probes/load_bench.py [--concurrency 1,2,4,8] [--rounds 3] [--spec-n 2] [--spec-m 3]
                                [--limit N] [--max-tokens N] [--threads 2] [--json]

1. c(T) of llama-server by prompt evaluation on a one-slot server, on the grid up to the
   largest step asked for (B x (1 + m)): `kolibri bench --engine llama-server --curve T`'s
   function (bench.engine_costs.curve_costs).
2. Per B, two llama-servers with `-np B` on the default model's GGUF, started as kolibri starts
   them (engines.launch: --no-repack, the same threads): plain, and `--spec-type ngram-simple`
   with size n and m (kolibri's `llamacpp-simple`, window n, k m). B client threads; client b
   sends the chat goldens' prompt ids in slot b's order (load.slot_orders, as the step model
   replays them), greedy, each for its golden's own output length with eos ignored, so plain
   and spec decode the same number of tokens at the same positions. Throughput: tokens decoded
   while all B clients are busy (from the last client's first request to the first client's
   last answer; the requests cut by that window count in proportion to their time inside it)
   over the window's length. Rounds alternate the order of B and of plain/spec; per B the
   per-round ratios' median and range are shown.
3. The prediction: the chains the spec server returned (client 0, first round), simulated with
   `llamacpp-simple` at the server's n and m (probe.replay.shards.simulate; its drafted/accepted are
   checked against the server's counters), priced with the server's c(T) at concurrency B
   (load.load_point). Plain scaling: the step model gives throughput(B) / throughput(1) =
   B / c(B).
Prefill is inside the measured window (a joining request's prompt is evaluated in the step it
joins); the step model leaves it out. "server decode" is the speedup by the server's own decode
timings (timings.predicted_ms summed over requests: prompt processing excluded).
Run it alone on the machine (`flock -x /work/scratch/cpu.lock` here); progress on stderr.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from serve_bench import cpu_name

from kolibri_cli.bench.engine_costs import curve_costs
from kolibri_cli.costs.model import cost_model
from kolibri_cli.decode.proposers import make_proposer
from kolibri_cli.engines import LOCAL, LlamaServer, ServerSpec, connect
from kolibri_cli.goldens.chains import DEFAULT_CHAT, SHIPPED, load_goldens
from kolibri_cli.probe.load import LoadCurve, crossover, load_point, slot_orders
from kolibri_cli.probe.replay.shards import simulate
from kolibri_cli.store.cache import gguf_file
from kolibri_cli.store.models import open_model

SERVER_GOLDENS = SHIPPED / "llama-server" / "smollm2-135m-instruct" / "chat.jsonl"


@dataclass
class Request:
    """One answered request of a round."""

    client: int
    golden: int  # index into the goldens
    start: float  # perf_counter seconds
    end: float
    ids: list[int]
    decode_s: float  # the server's predicted_ms / 1000
    drafted: int
    accepted: int


@dataclass
class Round:
    """One round of one server: every client's requests, and the busy window."""

    requests: list[Request]
    clients: int

    @property
    def window(self) -> tuple[float, float]:
        firsts = [min(r.start for r in self.of(b)) for b in range(self.clients)]
        lasts = [max(r.end for r in self.of(b)) for b in range(self.clients)]
        return max(firsts), min(lasts)

    def of(self, client: int) -> list[Request]:
        return [r for r in self.requests if r.client == client]

    @property
    def throughput(self) -> float:
        """tokens/s while every client had a request in flight."""
        t0, t1 = self.window
        tokens = sum(len(r.ids) * max(0.0, min(r.end, t1) - max(r.start, t0)) / (r.end - r.start)
                     for r in self.requests)
        return tokens / (t1 - t0)

    @property
    def decode_s(self) -> float:
        return sum(r.decode_s for r in self.requests)


@dataclass
class Side:
    """One server (plain or spec) at one B, over the rounds."""

    api: object
    rounds: list[Round] = field(default_factory=list)


def run_round(api, goldens, orders: list) -> Round:
    """B clients, started together, each sending its goldens in its order, one at a time."""
    barrier = threading.Barrier(len(orders))

    def client(b: int) -> list[Request]:
        barrier.wait()
        done = []
        for i in orders[b]:
            g = goldens[i]
            t0 = time.perf_counter()
            c = api.complete(g.prompt_ids, len(g.output_ids), ignore_eos=True)
            done.append(Request(b, int(i), t0, time.perf_counter(), c.output_ids,
                                c.decode_s or 0.0, c.drafted or 0, c.accepted or 0))
        return done

    with ThreadPoolExecutor(len(orders)) as pool:
        done = list(pool.map(client, range(len(orders))))
    return Round([r for rs in done for r in rs], len(orders))


def measure(a, goldens, gguf, model, concurrencies, spec_args, log) -> dict:
    """{B: {"plain": Side, "spec": Side}} after `a.rounds` alternating rounds."""
    with ExitStack() as stack:
        sides = {}
        for b in concurrencies:
            sides[b] = {}
            for name, args in (("plain", ()), ("spec", spec_args)):
                spec = ServerSpec(gguf, a.threads, args=args, slots=b)
                server = stack.enter_context(LlamaServer(spec))
                api = connect(server.url, "llama.cpp", model.tokenizer, model.eos_ids, 3600,
                              vocab=model.vocab_size)
                api.complete(goldens[0].prompt_ids, 8)  # warm-up, not timed
                sides[b][name] = Side(api)
        log.version = server.version()
        for r in range(a.rounds):
            for i, b in enumerate(concurrencies[:: 1 if r % 2 == 0 else -1]):
                orders = slot_orders(len(goldens), b)
                for name in ("plain", "spec")[:: 1 if (r + i) % 2 == 0 else -1]:
                    side = sides[b][name]
                    side.rounds.append(run_round(side.api, goldens, orders))
                    print(f"round {r + 1}, B = {b}, {name}: "
                          f"{side.rounds[-1].throughput:.1f} tok/s", file=sys.stderr)
    return sides


def predict(goldens, sides: dict, n: int, m: int, costs: dict) -> dict:
    """Per B: the step model's figures on the chains the spec server returned."""
    c, out = cost_model(costs), {}
    for b, side in sides.items():
        first = side["spec"].rounds[0]
        by_golden = {r.golden: r.ids for r in first.of(0)}
        chains = [replace(g, output_ids=by_golden[i]) for i, g in enumerate(goldens)]
        run = simulate(chains, m, (n, n), "llamacpp-simple")
        served = first.of(0)
        same = sum(r.ids == by_golden[r.golden] for s in side["spec"].rounds for r in s.requests)
        total = sum(len(s.requests) for s in side["spec"].rounds)
        plain_same = sum(r.ids == by_golden[r.golden] for s in side["plain"].rounds
                         for r in s.requests)
        out[b] = {"point": load_point(run, b, c), "run": run,
                  "drafts": (run.total.drafts_proposed, run.total.drafts_accepted),
                  "server_drafts": (sum(r.drafted for r in served),
                                    sum(r.accepted for r in served)),
                  "spec_chains_equal": (same, total),
                  "plain_chains_equal": (plain_same, total),
                  "plain_scaling": b / c(b)}
    return out


def ratios(num: list[Round], den: list[Round], how) -> list[float]:
    return [how(x) / how(y) for x, y in zip(num, den, strict=True)]


def figures(sides: dict, predicted: dict, curve) -> list[dict]:
    """One row per B: measured and predicted, spec over plain and plain over plain at B = 1."""
    base = sides[min(sides)]["plain"].rounds
    rows = []
    for b, side in sides.items():
        p, s = side["plain"].rounds, side["spec"].rounds
        speed = ratios(s, p, lambda x: x.throughput)
        decode = ratios(p, s, lambda x: x.decode_s)
        scaling = ratios(p, base, lambda x: x.throughput)
        c_batch = [b / x for x in scaling]  # a plain step at B over one at B = 1
        pr = predicted[b]
        rows.append({
            "B": b,
            "plain_tokens_per_s": [round(x.throughput, 2) for x in p],
            "spec_tokens_per_s": [round(x.throughput, 2) for x in s],
            "speedup_measured": statistics.median(speed), "speedup_by_round": speed,
            "speedup_server_decode": statistics.median(decode),
            "speedup_predicted": pr["point"].speedup,
            "tokens_in_flight_predicted": pr["point"].in_flight,
            "acceptance_predicted": pr["point"].acceptance,
            "drafts_simulated": pr["drafts"], "drafts_server": pr["server_drafts"],
            "spec_chains_equal_client0": pr["spec_chains_equal"],
            "plain_chains_equal_client0": pr["plain_chains_equal"],
            "plain_scaling_measured": statistics.median(scaling),
            "plain_scaling_by_round": scaling,
            "plain_scaling_predicted": pr["plain_scaling"],
            "c_prompt_eval": cost_model(curve.costs)(b),
            "c_batch_decode": statistics.median(c_batch),
        })
    return rows


def crossovers(rows: list[dict]) -> dict:
    """The largest B up to which drafting pays, measured and predicted (load.crossover)."""
    def of(key: str):
        points = [_Point(r["B"], r[key]) for r in rows]
        return crossover(LoadCurve(None, points))
    return {"measured": of("speedup_measured"), "predicted": of("speedup_predicted"),
            "same_side_every_B": all((r["speedup_measured"] > 1) == (r["speedup_predicted"] > 1)
                                     for r in rows)}


@dataclass
class _Point:
    concurrency: int
    speedup: float


class _Log:
    version = ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,2,4,8", help="B values, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spec-n", type=int, default=2, help="ngram-simple size n (window)")
    ap.add_argument("--spec-m", type=int, default=3, help="ngram-simple size m (k)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N goldens")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="decode at most N tokens of each golden (a shorter run)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--curve-repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    concurrencies = sorted({int(x) for x in a.concurrency.split(",")})
    goldens = [replace(g, output_ids=g.output_ids[: a.max_tokens])
               for g in load_goldens(DEFAULT_CHAT)[: a.limit]]
    model = open_model(None, weights=False)
    gguf = gguf_file(model.path)
    proposer = make_proposer("llamacpp-simple", a.spec_m, (a.spec_n, a.spec_n))
    load, log = [os.getloadavg()[0]], _Log()
    most = max(concurrencies) * (1 + a.spec_m)
    print(f"c(T) up to {most} tokens by prompt evaluation ...", file=sys.stderr)
    curve = curve_costs(LOCAL, model, a.spec_m, most, a.curve_repeats, gguf=gguf,
                        threads=a.threads)
    print(f"{len(goldens)} goldens, B = {concurrencies}, {a.rounds} rounds: starting "
          f"{2 * len(concurrencies)} llama-servers", file=sys.stderr)
    sides = measure(a, goldens, gguf, model, concurrencies, proposer.server_args(), log)
    load.append(os.getloadavg()[0])
    rows = figures(sides, predict(goldens, sides, a.spec_n, a.spec_m, curve.costs), curve)
    server_goldens = {str(g.id): g.output_ids for g in load_goldens(SERVER_GOLDENS)}
    at_one = sides[concurrencies[0]]["plain"].rounds[0].of(0)
    equal = sum(server_goldens.get(str(goldens[r.golden].id), [])[: len(r.ids)] == r.ids
                for r in at_one)
    doc = {"cpu": cpu_name(), "threads": a.threads, "llama_server": log.version,
           "flags": "--no-repack", "spec": " ".join(proposer.server_args()),
           "goldens": len(goldens), "rounds": a.rounds, "load_average": load,
           "curve": {"method": curve.method, "repeats": curve.repeats,
                     "costs": {str(n): c for n, c in curve.costs.items()}},
           "chains_equal_llama_server_goldens": [equal, len(at_one)],
           "rows": rows, "crossover": crossovers(rows)}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    report(doc)


def drafts(pair) -> str:
    return f"{pair[0]}/{pair[1]}"


def report(doc: dict) -> None:
    print(f"{doc['cpu']}, {doc['threads']} threads; {doc['llama_server']}, {doc['flags']}; "
          f"{doc['goldens']} chat goldens x {doc['rounds']} rounds; load average "
          f"{doc['load_average'][0]:.1f} -> {doc['load_average'][1]:.1f}")
    print(f"spec: {doc['spec']}; c(T) by prompt evaluation: " + ", ".join(
        f"c({n})={c:.2f}" for n, c in doc["curve"]["costs"].items()))
    print(f"\n{'B':>3} {'plain tok/s':>12} {'spec tok/s':>11} {'measured':>9} {'range':>11} "
          f"{'server decode':>13} {'predicted':>9} {'error':>7} {'drafts sim/server':>18}")
    for r in doc["rows"]:
        lo, hi = min(r["speedup_by_round"]), max(r["speedup_by_round"])
        error = r["speedup_predicted"] / r["speedup_measured"] - 1
        print(f"{r['B']:>3} {statistics.median(r['plain_tokens_per_s']):>12.1f} "
              f"{statistics.median(r['spec_tokens_per_s']):>11.1f} "
              f"{r['speedup_measured']:>8.3f}x {lo:>5.3f}-{hi:<5.3f} "
              f"{r['speedup_server_decode']:>12.3f}x {r['speedup_predicted']:>8.3f}x "
              f"{error:>+7.1%} {drafts(r['drafts_simulated']):>9} {drafts(r['drafts_server'])}")
    x = doc["crossover"]
    print(f"crossover (largest B up to which drafting pays): measured {x['measured']}, "
          f"predicted {x['predicted']}; predicted on the same side of 1.0x at every B: "
          f"{x['same_side_every_B']}")
    print(f"\n{'B':>3} {'plain tok/s / B=1':>18} {'range':>11} {'B/c(B)':>7} {'error':>7} "
          f"{'c(B) prompt eval':>16} {'c(B) batch decode':>17}")
    for r in doc["rows"]:
        lo, hi = min(r["plain_scaling_by_round"]), max(r["plain_scaling_by_round"])
        error = r["plain_scaling_predicted"] / r["plain_scaling_measured"] - 1
        print(f"{r['B']:>3} {r['plain_scaling_measured']:>17.3f}x {lo:>5.3f}-{hi:<5.3f} "
              f"{r['plain_scaling_predicted']:>6.3f}x {error:>+7.1%} "
              f"{r['c_prompt_eval']:>16.3f} {r['c_batch_decode']:>17.3f}")
    same = [f"B={r['B']}: spec {r['spec_chains_equal_client0'][0]}/"
            f"{r['spec_chains_equal_client0'][1]}, plain {r['plain_chains_equal_client0'][0]}"
            for r in doc["rows"]]
    print("chains equal to client 0's first spec round: " + "; ".join(same))
    print(f"chains at B = 1 equal to goldens/llama-server: "
          f"{doc['chains_equal_llama_server_goldens'][0]}/"
          f"{doc['chains_equal_llama_server_goldens'][1]}")


if __name__ == "__main__":
    main()
