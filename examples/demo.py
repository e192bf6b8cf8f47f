"""`make demo`: the project's main job, run from a fresh clone.

For now it prints the presets table (examples/presets_table.py): one 4096x4096 layer
quantized under every preset, with bits/weight, bytes and errors.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a plain script

import presets_table  # noqa: E402


def main(argv: list[str] | None = None) -> None:
  presets_table.main(argv)


if __name__ == "__main__":
  main(sys.argv[1:])
