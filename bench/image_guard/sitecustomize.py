"""On PYTHONPATH in every process of gpu_check.sh's CPU dry run, and nowhere else: tokshard's
own code may import only what the GPU image has or what bench/gpu_carry.py carries."""

import sys
from pathlib import Path

root = str(Path(__file__).resolve().parents[2])
if root not in sys.path:
    sys.path.insert(0, root)
from bench.gpu_carry import install_image_guard  # noqa: E402

install_image_guard()
