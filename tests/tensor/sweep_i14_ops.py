"""Run the OpInfo sweep (tests/tensor/test_opinfo_sweep.py) for the ops of the CFD-surrogate rules only.

    PYTHONPATH=. python tests/tensor/sweep_i14_ops.py [substring ...]  # each op's verdict; exit 1 on WRONG/ERROR

``MESHSHARD_SWEEP_TRACE=<dir>`` makes every rank write the case it is in (a hung case names itself).
"""

from __future__ import annotations

import json
import sys

from meshshard.testing import run_distributed

KEYS = ("loss", "cross_entropy", "kl_div", "nll", "batch_norm", "instance_norm", "conv1d", "conv2d", "conv3d",
        "adaptive_max_pool1d",
        "adaptive_avg_pool1d", "max_pool1d", "avg_pool1d", "cdist", "linalg.norm", "vector_norm", "normalize",
        "cosine_similarity", "index_add", "index_reduce", "scatter", "expand", "repeat", "cat", "pad")


def names() -> list[str]:
    from tests.tensor.test_opinfo_sweep import _names

    return [n for n in _names() if any(k in n for k in KEYS) and "sparse" not in n and "_conv_transpose" not in n]


if __name__ == "__main__":
    from tests.tensor.test_opinfo_sweep import OK, RAISES, SKIP, WORLD, _sweep, summarise

    ops = [n for n in names() if not sys.argv[1:] or any(k in n for k in sys.argv[1:])]
    per_rank = run_distributed(_sweep, WORLD, ops, timeout=1800)
    res = per_rank[0]
    differ = {k for r in per_rank[1:] for k in res if r[k] != res[k]}
    for k in sorted(differ):
        print("RANKS DIFFER", k, [r[k][:4] for r in per_rank])
    print(json.dumps(summarise(res), indent=1, sort_keys=True))
    bad = {k: [c for c in v if c[0] not in (OK, RAISES, SKIP)] for k, v in res.items()}
    bad = {k: v for k, v in bad.items() if v}
    for k, v in bad.items():
        print("BAD", k, v[:3])
    sys.exit(1 if bad or differ else 0)
