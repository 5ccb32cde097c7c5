"""An end-to-end decode engine for benchmarking the FP8 and BF16 caches at the same memory:
a DeepSeek-V3-shaped model (model.py), continuous batching over a paged pool (engine.py), the
benchmark and its command line (bench.py, `python -m snapmla.e2e`) and its results files
(report.py). Needs PyTorch; importing this package alone does not."""
