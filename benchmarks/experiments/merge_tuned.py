"""Adopt one algorithm's tuned rows into the shipped table where it clearly wins, keep the rest.

``tune`` picks the fastest candidate of one run at every size, and between shapes of the already
shipped algorithms that pick is often noise. This merges only what a new algorithm earned: for
each tuned size ``t_i`` (regions ``(t_{i-1}, t_i]``), if the best ``--algo`` candidate beats the best
other candidate by at least ``--margin``, the region gets that candidate; everything else keeps the
shipped table's rows. Prints what changed, with the measured times.

    python benchmarks/experiments/merge_tuned.py --algo ll_twoshot --tuned tune-tp4.json tune-tp2.json \
        --out merged.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tritoncomm.collectives.tuning import Choice, SelectionTable

SHIPPED = Path(__file__).resolve().parents[2] / "tritoncomm" / "collectives" / "tables" / "nvidia-h200.json"


def parse_choice(text: str) -> Choice:
    m = re.fullmatch(r"Choice\(algo='(\w+)', programs=(\d+), block=(\d+), num_warps=(\d+)\)", text)
    if not m:
        raise ValueError(text)
    return Choice(m[1], int(m[2]), int(m[3]), int(m[4]))


def merge(shipped: SelectionTable, measured: list[dict], algo: str, margin: float) -> tuple[SelectionTable, list]:
    rows = dict(shipped.rows)
    notes = []
    for world in sorted({m["world"] for m in measured if m["op"] == "allreduce"}):
        ms = sorted((m for m in measured if m["op"] == "allreduce" and m["world"] == world), key=lambda m: m["bytes"])
        wins: list[tuple[int, int, Choice]] = []  # (lo exclusive, hi inclusive, choice)
        prev = ms[0]["bytes"] // 2
        for m in ms:
            cand = {parse_choice(k): v for k, v in m["candidates"].items()}
            mine = {c: v for c, v in cand.items() if c.algo == algo}
            other = {c: v for c, v in cand.items() if c.algo != algo}
            if mine and other:
                c = min(mine, key=mine.get)
                o = min(other, key=other.get)
                if mine[c] <= (1 - margin) * other[o]:
                    wins.append((prev, m["bytes"], c))
                    notes.append((world, m["bytes"], c, round(mine[c], 2), o, round(other[o], 2)))
            prev = m["bytes"]
        for dtype in ("bf16", "fp16", "fp32"):
            old = shipped.rows[("allreduce", world, dtype)]
            cuts = sorted({b for b, _ in old} | {hi for _, hi, _ in wins} | {lo for lo, _, _ in wins})
            new: list[tuple[int, Choice]] = []
            for b in cuts:
                won = next((c for lo, hi, c in wins if lo < b <= hi), None)
                c = won or shipped.lookup("allreduce", world, dtype, b)
                if new and new[-1][1] == c:
                    new[-1] = (b, c)
                else:
                    new.append((b, c))
            rows[("allreduce", world, dtype)] = new
    return SelectionTable(rows, "merged"), notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", required=True)
    ap.add_argument("--tuned", nargs="+", required=True)
    ap.add_argument("--shipped", default=str(SHIPPED))
    ap.add_argument("--margin", type=float, default=0.03)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    data = json.loads(Path(args.shipped).read_text())
    shipped = SelectionTable.from_json(data.get("table", data))
    measured = [m for p in args.tuned for m in json.loads(Path(p).read_text())["measured"]]
    table, notes = merge(shipped, measured, args.algo, args.margin)
    for w, b, c, t, o, to in notes:
        print(f"TP{w} {b:>9} {c} {t:.2f} us  (best other {o} {to:.2f})")
    adopted = [{"world": w, "bytes": b, "choice": repr(c), "us": t, "best_other": repr(o), "best_other_us": to}
               for w, b, c, t, o, to in notes]
    out = dict(data, table=table.to_json(), adopted=adopted) if "table" in data else table.to_json()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
