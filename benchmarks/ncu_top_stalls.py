"""The SASS instructions with the most warp-stall samples, from ``ncu --page source --csv``
output (``--print-source sass``): one line per instruction, its samples and its text.

  ncu --import R.ncu-rep --page source --csv --print-source sass > src.csv
  python3 benchmarks/ncu_top_stalls.py src.csv --top 30
"""
from __future__ import annotations

import argparse
import csv
import io


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("csv")
  ap.add_argument("--top", type=int, default=30)
  args = ap.parse_args()
  text = open(args.csv, errors="replace").read()
  # the header row: the first line naming an address / "#" column
  start = next((i for i in (text.find('"#"'), text.find('"# Address"'),
                            text.find('"Address"')) if i >= 0), 0)
  rows = list(csv.DictReader(io.StringIO(text[start:])))
  if not rows:
    raise SystemExit(f"{args.csv}: no CSV rows (first 300 chars: {text[:300]!r})")
  cols = [c for c in rows[0] if c is not None]  # (None: cells past the header)
  print("columns:", cols)
  key = next((c for c in cols if "Stall Sampling (All" in c), None) or next(
      (c for c in cols if "Sampling" in c), None)
  if key is None:
    raise SystemExit("no warp-stall sampling column")
  def num(v) -> float:  # "1,234" -> 1234.0; empty, "N/A" or "12 %" -> what parses, else 0
    try:
      return float(str(v or "0").replace(",", "").rstrip("% ") or 0)
    except ValueError:
      return 0.0

  total = sum(num(r[key]) for r in rows)
  src = next((c for c in cols if c in ("Source", "SASS")), cols[1])
  print(f"{key}: {total:.0f} samples over {len(rows)} instructions")
  for r in sorted(rows, key=lambda r: -num(r[key]))[:args.top]:
    extra = {c: r[c] for c in cols if "stall" in c.lower() and c != key and num(r[c])}
    print(f"{num(r[key]) / max(total, 1) * 100:5.1f}%  {r[cols[0]]}  "
          f"{r[src][:70]}  {extra if len(str(extra)) < 200 else ''}")


if __name__ == "__main__":
  main()
