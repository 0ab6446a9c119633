"""`kolibri probe`: would n-gram speculation pay off on these golden chains?

- simulate: the exact acceptance simulation over golden chains (no model), sweeps, the cost model;
- measure: the model run plain and speculative on each golden, measured vs predicted;
- config: PROBE.toml and its merge with the command line;
- report: the JSON document, the Markdown report, CI gates.
Definitions: docs/simulation.md; the answer: docs/probe.md.
"""
