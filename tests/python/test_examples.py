"""The examples README shows run as written (they need PyTorch)."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quickstart_runs():
    pytest.importorskip("torch", reason="examples/quickstart.py needs PyTorch")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "out (1, 1, 16, 512) torch.bfloat16, lse (1, 16, 1)" in done.stdout, done.stdout
