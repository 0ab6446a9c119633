"""`kolibri probe`: would n-gram speculation pay off on these golden chains?

- simulate: the exact acceptance simulation over golden chains (no model), sweeps, the cost model;
- config: PROBE.toml and its merge with the command line;
- report: the JSON document, the Markdown report, CI gates.
Definitions: docs/probe.md.
"""
