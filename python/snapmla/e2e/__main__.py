"""`python -m snapmla.e2e`: the end-to-end decode benchmark (needs PyTorch)."""

import os
import sys

try:
    import torch  # noqa: F401
except ImportError:
    sys.exit("snapmla.e2e needs PyTorch (pip install torch); the rest of snapmla does not")

from .bench import main

rc = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    # A rank of a tensor-parallel run leaves without the interpreter's finalization: the model
    # keeps a handle on the process group, so gloo's worker threads outlive
    # destroy_process_group and are torn down while the interpreter is, which can abort the
    # process ("terminate called without an active exception") after a run that succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc or 0)
sys.exit(rc)
