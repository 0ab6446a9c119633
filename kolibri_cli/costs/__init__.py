"""The cost model c(n): what an n-token forward costs relative to a 1-token one, in one place.

- model: c(n) as a function (`cost_model`, the guess, the least-squares line) and `CostTable`,
  c(n) given or measured by the speculative generator from its own passes;
- pricing: which c(n) a run uses and where they came from (`Pricing`: given, a stored bench,
  timed in this run, or the guess) — the one vocabulary generate, bench, probe and the guard
  share;
- store: the c(n) each `kolibri bench` (or `probe --costs measure`) timed, kept per model,
  threads and numerics in KOLIBRI_HOME/bench-costs.json;
- samples: the guard's own timings, kept per kernel between runs (guard-costs.json).
- timing: c(n) timed on this host's kernel (`kolibri bench`, `probe --costs measure`).
Docs: docs/costs.md.
"""


def forget_model(model_sha256: str) -> dict[str, int]:
    """Drop what the home keeps of one model's costs (`kolibri model rm`): {file: entries}."""
    from kolibri_cli.costs import samples, store

    return {store.FILE: store.forget(model_sha256), samples.FILE: samples.forget(model_sha256)}
