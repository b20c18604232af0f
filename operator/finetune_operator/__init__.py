"""finetune-operator: fine-tune Hugging Face models on Trainium, Xeon, CPU and NVIDIA from one FineTuneJob."""

__version__ = "0.1.0"
