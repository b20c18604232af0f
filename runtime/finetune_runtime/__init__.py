"""In-pod training runtime of finetune-operator (see docs/architecture.md for its contract)."""

from importlib.metadata import version

# The repository's VERSION file, through the installed package's metadata (runtime/pyproject.toml reads it).
__version__ = version("finetune-runtime")
