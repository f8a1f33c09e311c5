"""The OpInfo sweep (``test_opinfo_sweep._sweep``) restricted to the row-halo grid ops, on 3 gloo ranks.

``python tests/tensor/sweep_grid.py [substring ...]`` prints every case's verdict; each must be ``exact``
or ``raises`` (exit 1 otherwise); the full sweep (test_opinfo_sweep.py) runs the same ops among all others.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAMES = [
    "diff", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.interpolate.bilinear",
    "nn.functional.interpolate.linear", "nn.functional.interpolate.nearest", "nn.functional.interpolate.nearest-exact",
    "nn.functional.interpolate.trilinear", "nn.functional.max_pool1d", "nn.functional.max_pool2d",
    "nn.functional.max_pool3d", "nn.functional.pad.circular", "nn.functional.pad.constant",
    "nn.functional.pad.reflect", "nn.functional.pad.replicate", "nn.functional.pad.replicate_negative",
    "nn.functional.unfold", "unfold", "unfold_copy", "constant_pad_nd", "nn.functional.upsample_bilinear",
    "nn.functional.upsample_nearest", "nn.functional.interpolate.bicubic", "nn.functional.interpolate.area",
]


def main(keys: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from meshshard.testing import run_distributed
    from tests.tensor.test_opinfo_sweep import OK, RAISES, SKIP, VERDICT, _op_db, _sweep

    known = _op_db()
    names = [n for n in NAMES if n in known and (not keys or any(k in n for k in keys))]
    per_rank = run_distributed(_sweep, 3, names, timeout=900)
    differ = sorted(k for r in per_rank[1:] for k in r if r[k] != per_rank[0][k])
    for k in differ:
        print("RANKS DIFFER", k, [r[k][:4] for r in per_rank])
    bad = 0
    for name, cases in per_rank[0].items():
        for code, note in cases:
            print(f"{name:45s} {VERDICT[code]:7s} {note}")
            bad += code not in (OK, RAISES, SKIP)
    print(f"{bad} case(s) neither exact nor raising")
    return int(bad > 0 or bool(differ))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
