"""`python -m snapmla.e2e`: the end-to-end decode benchmark (needs PyTorch)."""

import sys

try:
    import torch  # noqa: F401
except ImportError:
    sys.exit("snapmla.e2e needs PyTorch (pip install torch); the rest of snapmla does not")

from .bench import main

sys.exit(main())
