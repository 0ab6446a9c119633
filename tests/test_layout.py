"""The package layout's promises: layer rules hold, light modules stay light, data ships."""

import ast
import json
import os
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
    (built,) = tmp.glob("kolibri-*.whl")
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
