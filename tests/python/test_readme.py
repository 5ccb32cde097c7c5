"""What a new user meets first: README's NumPy Python block is examples/quickstart_numpy.py and runs
with NumPy alone (PyTorch made unimportable); `pip install <path>` keeps the source tree clean and brings
NumPy."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart_numpy.py"


def test_readme_python_block_is_the_numpy_quickstart():
    readme = (ROOT / "README.md").read_text()
    assert "```python\n" + EXAMPLE.read_text() + "```\n" in readme, \
        "README.md's NumPy ```python block differs from examples/quickstart_numpy.py: copy the file into it"


def test_quickstart_runs_without_torch():
    block_torch = "import sys; sys.modules['torch'] = None; "  # `import torch` raises ImportError
    code = block_torch + f"exec(compile(open({str(EXAMPLE)!r}).read(), 'quickstart_numpy.py', 'exec'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(2, 1, 8, 512) (2, 8, 1)" in r.stdout, r.stdout


def test_pip_install_builds_outside_the_source_tree_and_brings_numpy():
    """pyproject.toml sets no scikit-build build-dir (so `pip install <path>` builds in a temporary
    directory, not in <path>/build), and NumPy is a dependency of the package."""
    tomllib = __import__("pytest").importorskip("tomllib", reason="tomllib needs Python >= 3.11")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "build-dir" not in meta["tool"]["scikit-build"]
    assert any(d.replace(" ", "").startswith("numpy") for d in meta["project"]["dependencies"])
