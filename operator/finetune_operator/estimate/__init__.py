"""Throughput, time and cost of a job on each kind of hardware, before it runs (`ftjob estimate`, docs/estimate.md).

Layering: reads the API types, the profiles' throughput data and the pure layout builders; no cluster, no kopf.
- flops.py: model FLOPs per training sample from a Hugging Face config (LoRA included);
- workload.py: a run described for the model (from a job or a record); models.yaml;
- calibration.py: measured runs (calibration.yaml, --calibration files), the fit and the prediction;
- predict.py: a job -> rows for it and for every profile's instance types; prices.yaml, datasets.yaml;
- report.py: text and JSON, and the leave-one-out check behind docs/estimate.md's table.
"""

from __future__ import annotations

from .calibration import Calibration, Record, load_records, predict, shipped_records
from .flops import Lora, ModelShape, flops_per_sample
from .predict import Estimate, estimate, load_prices
from .report import leave_one_out, loo_markdown, render_text, to_json
from .workload import Workload

__all__ = [
    "Calibration",
    "Estimate",
    "Lora",
    "ModelShape",
    "Record",
    "Workload",
    "estimate",
    "flops_per_sample",
    "leave_one_out",
    "load_prices",
    "load_records",
    "loo_markdown",
    "predict",
    "render_text",
    "shipped_records",
    "to_json",
]
