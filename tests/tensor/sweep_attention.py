"""The OpInfo sweep (``test_opinfo_sweep._sweep``) restricted to the attention ops, on 3 gloo ranks.

``python tests/tensor/sweep_attention.py`` prints every case's verdict; each must be ``exact`` or
``raises``. ``test_attention.py::test_opinfo_sweep_attention_ops`` runs the same check under pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAMES = ["nn.functional.scaled_dot_product_attention", "nn.functional.multi_head_attention_forward"]


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from meshshard.testing import run_distributed
    from tests.tensor.test_opinfo_sweep import OK, RAISES, SKIP, VERDICT, _sweep

    per_rank = run_distributed(_sweep, 3, NAMES, timeout=600)
    if any(r != per_rank[0] for r in per_rank[1:]):
        print("ranks recorded different verdicts")
        return 1
    bad = 0
    for name, cases in per_rank[0].items():
        for code, note in cases:
            print(f"{name:50s} {VERDICT[code]:7s} {note}")
            bad += code not in (OK, RAISES, SKIP)
    print(f"{bad} case(s) neither exact nor raising")
    return int(bad > 0)


if __name__ == "__main__":
    raise SystemExit(main())
