"""finetune-operator: fine-tune Hugging Face models on Trainium, Xeon, CPU and NVIDIA from one FineTuneJob."""

from importlib.metadata import version

# The repository's VERSION file, through the installed package's metadata (operator/pyproject.toml reads it).
# It is also the default tag of the runtime images (builders/images.py).
__version__ = version("finetune-operator")
