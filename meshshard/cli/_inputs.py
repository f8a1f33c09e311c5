"""What the subcommands check before any rank starts: output paths, the store and its part counts.

Standard library only at import time (``meshshard --help`` imports no torch, numpy or VTK).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError

__all__ = ["check_out_file", "check_out_folder", "check_parts", "load_store_meta"]


def load_store_meta(command: str, store: str) -> dict[str, Any]:
    """The store's ``meta.json``, or a one-line usage error saying what is wrong with ``store``."""
    if not os.path.isdir(store):
        raise UsageError(f"meshshard {command}: store not found: {store} (write one with 'meshshard preprocess')")
    path = os.path.join(store, "meta.json")
    if not os.path.isfile(path):
        raise UsageError(f"meshshard {command}: {store} is not a store (no meta.json); run 'meshshard preprocess'")
    from ..datasets import load_meta  # the one reader: format and file names checked

    try:
        meta = load_meta(store)
        meta["order_of"]  # noqa: B018  (present in every store format)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"meshshard {command}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    return meta


def check_parts(command: str, store: str, meta: dict[str, Any], ranks: int, dp: int) -> None:
    """The store must serve the per-sample part count ``ranks / dp``: checked before any rank starts."""
    if ranks % dp:
        raise UsageError(f"meshshard {command}: --dp {dp} must divide the number of ranks ({ranks})")
    parts = ranks // dp
    served = sorted(int(p) for p in meta["order_of"])
    if str(parts) not in meta["order_of"]:
        how = f"{ranks} ranks" + (f" / --dp {dp}" if dp > 1 else "")
        raise UsageError(
            f"meshshard {command}: the store {store} has no partition for P={parts} ({how}); it serves P in "
            f"{served}: preprocess again with --parts {' '.join(str(p) for p in sorted({*served, parts}))}, "
            f"or choose --nproc so that --nproc / --dp is one of {served}"
        )


def check_out_folder(command: str, out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"meshshard {command}: --out must be a folder, but {out} is a file")


def check_out_file(command: str, option: str, path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"meshshard {command}: {option} must be a file name (got the folder {path})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"meshshard {command}: {option}: folder {folder} does not exist")
