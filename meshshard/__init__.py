"""meshshard: domain parallelism for point clouds and unstructured meshes on PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
