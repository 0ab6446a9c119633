"""The package layout's promises: layer rules hold, light modules stay light, data ships."""

import shutil
import subprocess
import sys
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
                                    "kolibri_cli.probe.shard", "kolibri_cli.goldens.stream"])
def test_light_modules_do_not_load_the_kernel_or_the_terminal(module):
    """GGUF conversion needs RoPE math, not the numba kernel (whose LLVM option is process
    wide); nothing below cli imports typer or rich."""
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('kolibri_cli.engine.kernel', 'typer', 'rich') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_wheel_ships_the_default_goldens(tmp_path):
    """A plain (non-editable) install must carry the goldens `kolibri probe` reads by default."""
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the code
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "tests", "docs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("kolibri-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kolibri_cli/goldens/data/smollm2-135m-instruct/chat.jsonl" in names
    assert "kolibri_cli/goldens/data/prompts/chat.jsonl" in names
