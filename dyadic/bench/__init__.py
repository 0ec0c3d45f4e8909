"""Side-by-side benchmark: ``python -m dyadic.bench``.

Runs dyadic's backends and the pipelines users would write instead (plain
NumPy, plain PyTorch on the CPU; plain PyTorch eager and CUDA-graph replayed
on the GPU) on the same inputs in one process, and prints one table: median
time, min-max spread, the ratio to the plain-PyTorch pipeline and, on the
GPU, the ratio to the memory floor (bytes read once / copy bandwidth measured
in the same run).  Writes JSON, a Markdown table and a PNG plot.

``python -m dyadic.bench gpu``: GPU timings of backend="cuda" calls (gpu.py);
``python -m dyadic.bench compare``: A/B of those results (compare.py).
"""
