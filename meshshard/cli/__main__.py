"""``python -m meshshard.cli``: the ``meshshard`` command (how ``torchrun`` starts each rank)."""

from . import console_main

if __name__ == "__main__":  # spawned workers (preprocess --workers N) import this module again
    console_main()
