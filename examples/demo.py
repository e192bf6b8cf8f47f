"""`make demo`: the project's main job, run from a fresh clone.

1. examples/minilm_demo.py: the real all-MiniLM-L6-v2 sentence encoder in Flax, quantized
   with several recipes: bytes, embedding cosine vs bf16, retrieval agreement, time.
2. examples/presets_table.py: every preset on one layer (1024x1024 here to stay short;
   run presets_table.py alone for 4096x4096): bits/weight, bytes and errors.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a plain script

import minilm_demo  # noqa: E402
import presets_table  # noqa: E402


def main(argv: list[str] | None = None) -> None:
  print("=== all-MiniLM-L6-v2, quantized per recipe (examples/minilm_demo.py) ===")
  minilm_demo.main(argv or [])
  print("\n=== every preset on one layer (examples/presets_table.py) ===")
  presets_table.main(["--k", "1024", "--n", "1024"])


if __name__ == "__main__":
  main(sys.argv[1:])
