"""In-pod training runtime of finetune-operator (see docs/architecture.md for its contract)."""

__version__ = "0.1.0"
