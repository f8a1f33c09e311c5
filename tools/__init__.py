"""Applications of meshshard that are not part of the installed package (run with the repo on PYTHONPATH)."""
