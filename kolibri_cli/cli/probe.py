"""`kolibri probe`: would n-gram speculation make this faster, by how much, with which settings?

Parses the options (on top of an optional PROBE.toml; each declared once, in ProbeConfig), calls
probe/run.py, renders its ProbeResult (terminal, JSON, Markdown, PNG) and exits on its gates.
Heavy modules are imported inside the command so `kolibri --help` stays fast.
"""

import inspect
from contextlib import contextmanager
from pathlib import Path

import typer

from kolibri_cli.errors import KolibriError

KINDS = {"text": str | None, "int": int | None, "float": float | None, "switch": bool | None,
         "path": Path | None, "list": list[str] | None}  # str for lists: typer reads "" as "."


def probe(config: Path | None, **given) -> None:
    """Would n-gram speculation make this faster? Simulates it over golden chains (exact
    counts, no model needed) and answers in speed: the fastest setting, how much faster than
    plain decoding, how sure, and whether to turn it on. With --measure, each golden is also run
    as it was recorded (greedy or sampled) unless sampling options override that for all."""
    from kolibri_cli.probe.config import load_config

    run_probe(load_config(config, given))


def _signature() -> inspect.Signature:
    """probe's parameters: PROBE.toml, then one typer option per ProbeConfig option, in its
    --help panel (ProbeConfig declares each once)."""
    from kolibri_cli.probe.config import OPTIONS

    params = [inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=Path | None, default=typer.Argument(
                                    None, metavar="PROBE.toml", help="PROBE.toml with saved "
                                    "options (paths in it are relative to it)."))]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=KINDS[o.kind],
                                 default=typer.Option(None, *o.flags, metavar=o.metavar,
                                                      help=o.help, rich_help_panel=o.panel))
               for name, o in OPTIONS.items()]
    return inspect.Signature(params)


probe.__signature__ = _signature()
probe.__annotations__ = {p.name: p.annotation for p in probe.__signature__.parameters.values()}


def run_probe(cfg) -> None:
    """Run the probe (probe/run.py decides everything), write the files asked for, print the
    verdict first, then fail on the gates."""
    from kolibri_cli.cli.options import print_json
    from kolibri_cli.cli.render import note
    from kolibri_cli.cli.render.probe import render_probe, require_matplotlib, write_plot
    from kolibri_cli.probe import run
    from kolibri_cli.probe.config import command_line
    from kolibri_cli.probe.report import build_report, render_markdown
    from kolibri_cli.store.atomic import write_text_atomic

    if cfg.plot:
        require_matplotlib()
    result = run.run(cfg, _ui())
    if cfg.plot:
        write_plot(cfg.plot, result)
    if cfg.markdown:
        write_text_atomic(cfg.markdown, render_markdown(result, command_line(cfg),
                                                        plot=run.plot_link(cfg)))
        note(f"wrote {cfg.markdown}")
    if cfg.json:
        print_json(build_report(result), indent=None)
    else:
        render_probe(result)
    if cfg.pricing.note:
        note(cfg.pricing.note)
    if result.failures:
        more = f" (and {len(result.failures) - 3} more)" if len(result.failures) > 3 else ""
        raise KolibriError("gate failed: " + "; ".join(result.failures[:3]) + more)


def _ui():
    """The terminal the probe's workflow reports to: bars and notes on stderr."""
    from kolibri_cli.cli import options, render
    from kolibri_cli.cli.render.probe import throughput_bar
    from kolibri_cli.probe.run import Ui

    @contextmanager
    def progress(label: str):
        with render.progress_bar(label) as bar:
            yield lambda done, total: bar("", done, total)

    return Ui(load_model=lambda spec, threads, weights: options.load_model(spec, threads,
                                                                           weights=weights),
              load_tokenizer=options.load_tokenizer,
              sampling=lambda model, given: options.resolve_sampling(
                  model, options.sampling_options(**given)),
              progress=progress, simulating=throughput_bar, note=render.note)
