"""What a new user meets first: README's NumPy Python block is examples/quickstart_numpy.py and runs
with NumPy alone (PyTorch made unimportable); `pip install <path>` keeps the source tree clean and brings
NumPy; the README's H200 table is the results file's numbers."""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart_numpy.py"


def test_readme_python_block_is_the_numpy_quickstart():
    readme = (ROOT / "README.md").read_text()
    assert "```python\n" + EXAMPLE.read_text() + "```\n" in readme, \
        "README.md's NumPy ```python block differs from examples/quickstart_numpy.py: copy the file into it"


def test_readme_torch_block_is_the_quickstart():
    readme = (ROOT / "README.md").read_text()
    torch_example = (ROOT / "examples" / "quickstart.py").read_text()
    assert "```python\n" + torch_example + "```\n" in readme, \
        "README.md's PyTorch ```python block differs from examples/quickstart.py: copy the file into it"


def test_examples_use_the_models_softmax_scale():
    """Both quickstarts decode with DeepSeek-V3's scale, 192 ** -0.5 (one value in the README)."""
    for name in ("quickstart.py", "quickstart_numpy.py"):
        text = (ROOT / "examples" / name).read_text()
        assert "softmax_scale=192 ** -0.5" in text and "softmax_scale=576" not in text, name


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


def test_readme_results_table_is_the_sweep_file():
    """Every row of README.md's results table is a case of docs/results/h200_sweep.json with the
    same times and ratios (decode_fp8's own columns, or a same-run variant's where the header names
    its label: `decode_fp8 us (`LABEL`)`), and the text names the file's commit and date."""
    readme = (ROOT / "README.md").read_text()
    sweep = json.loads((ROOT / "docs" / "results" / "h200_sweep.json").read_text())
    assert f"commit {sweep['commit']}, {sweep['date']}" in readme
    by_case = {(r["b"], r["h"], r["s_q"], str(r["s_k"])): r for r in sweep["results"]}
    head = re.search(r"\| case \(b, h, s_q, s_k\) \| decode_fp8 us(?: \(`(\w+)`\))? \| FlashMLA BF16 us \| "
                     r"FlashMLA FP8 fork us \|", readme)
    assert head is not None
    fp8 = f"fp8_{head.group(1)}" if head.group(1) else "fp8"
    table = readme[head.start():].split("\n\n")[0].splitlines()[2:]
    assert len(table) >= 5
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        b, h, s_q, s_k = [c.strip() for c in cells[0].split(",")]
        key = (int(b), int(h), int(s_q), "U" if s_k.startswith("U") else s_k)
        r = by_case[key]
        got = [float(c.rstrip("x")) for c in cells[1:]]
        want = [r[f"{fp8}_us"], r["flashmla_bf16_us"], r["pr54_fp8_us"], r[f"{fp8}_speedup_vs_flashmla_bf16"],
                r[f"{fp8}_speedup_vs_pr54_fp8"]]
        assert got == want, (line, want)
        assert re.fullmatch(r"\d+", s_k) or s_k == "U(1..32K)"


def test_readme_e2e_table_is_the_e2e_file():
    """Every row of README.md's end-to-end table is a row of docs/results/e2e_h200.json (same
    deployment, heads, context, tokens/s, ratios), every row of the file is in the table, the
    text names the file's commit and date, and the file's BF16 baseline is FlashMLA's kernel."""
    readme = (ROOT / "README.md").read_text()
    e2e = json.loads((ROOT / "docs" / "results" / "e2e_h200.json").read_text())
    assert f"commit {e2e['commit']}, {e2e['date']}" in readme
    assert e2e["bf16_kernel"] == "flashmla" and all(r["bf16_kernel"] == "flashmla" for r in e2e["results"])
    head = "| deployment, heads per GPU | context | FP8 tokens/s | BF16 (FlashMLA) tokens/s |"
    table = readme[readme.index(head):].split("\n\n")[0].splitlines()[2:]
    want = {}
    for r in e2e["results"]:
        want[(r["deployment"], r["heads"], r["context"])] = [
            round(r["fp8_tokens_per_s"]), round(r["bf16_tokens_per_s"]), round(r["speedup"], 2),
            round(r["batch_ratio"], 2), round(r["step_ratio"], 2)]
    got = {}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        dep, heads = [c.strip() for c in cells[0].split(",")]
        key = (dep, int(heads), int(cells[1].rstrip("K")) * 1024)
        got[key] = [int(cells[2]), int(cells[3]), float(cells[4].rstrip("x")), float(cells[5]), float(cells[6])]
    assert got == want
