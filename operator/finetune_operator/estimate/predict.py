"""`ftjob estimate`: a validated job -> its workload, the hardware that could run it, and a prediction per row.

Pure: reads the job, the profiles, the calibration records, the price and dataset tables; no cluster.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import profiles
from ..admission import validate
from ..api.validation import InvalidSpec
from ..builders.layout import resolve
from .calibration import Calibration, Prediction, predict
from .flops import Lora
from .workload import Workload, _data, model_shape, rank_share

STATIC_PADDING_TASKS = ("question-answering",)  # squad.py pads every window to maxLength


@dataclass(frozen=True)
class Prices:
    date: str
    region: str
    source: str
    rows: dict[str, tuple[float | None, str | None]]  # instance type -> (USD per hour, note)

    def hourly(self, instance_type: str | None) -> tuple[float | None, str | None]:
        if instance_type is None:
            return None, "no instance type: no price"
        if instance_type not in self.rows:
            return None, f"{instance_type} is not in the price table"
        return self.rows[instance_type]


def parse_prices(doc: Any, where: str) -> Prices:
    if not isinstance(doc, dict) or not isinstance(doc.get("usdPerHour"), dict):
        raise ValueError(f"{where}: expected a mapping with date, region, source and usdPerHour")
    for key in ("date", "region", "source"):
        if not doc.get(key):
            raise ValueError(f"{where}: {key} is required (a price table says when and where it was read)")
    rows: dict[str, tuple[float | None, str | None]] = {}
    for itype, v in doc["usdPerHour"].items():
        if isinstance(v, dict):
            usd, note = v.get("usd"), v.get("note")
            if v.get("region") and v["region"] != doc["region"]:
                note = f"{v['region']} price" + (f": {note}" if note else "")
        else:
            usd, note = v, None
        if usd is not None and (isinstance(usd, bool) or not isinstance(usd, int | float) or usd < 0):
            raise ValueError(f"{where}: usdPerHour.{itype} must be a non-negative number or null")
        rows[str(itype)] = (None if usd is None else float(usd), note)
    return Prices(str(doc["date"]), str(doc["region"]), " ".join(str(doc["source"]).split()), rows)


@functools.cache
def shipped_prices() -> Prices:
    return parse_prices(_data("prices.yaml"), "estimate/prices.yaml")


def load_prices(path: str | Path | None) -> Prices:
    if not path:
        return shipped_prices()
    return parse_prices(yaml.safe_load(Path(path).read_text(encoding="utf-8")), str(path))


@functools.cache
def hub_datasets() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = _data("datasets.yaml")
    return out


# --- the job's work ---------------------------------------------------------------------------------------------


def dataset_id(task: dict[str, Any]) -> str | None:
    ds = task.get("dataset") or {}
    if ds.get("path"):
        return str(ds["path"])
    if ds.get("name"):
        return str(ds["name"])
    files = ds.get("dataFiles") or {}
    return str(files.get(ds.get("trainSplit", "train")) or "") or None


def samples_per_epoch(job: dict[str, Any], cwd: Path) -> tuple[int | None, str]:
    """Training samples per epoch, and how they were found."""
    task = job["spec"]["task"]
    ds = task.get("dataset") or {}
    if ds.get("trainSamples"):
        return int(ds["trainSamples"]), "dataset.trainSamples"
    if ds.get("path"):
        base = Path(ds["path"]) if Path(ds["path"]).is_absolute() else cwd / ds["path"]
        f = base / f"{ds.get('trainSplit', 'train')}.jsonl"
        if f.is_file():
            rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
            label_map, col = ds.get("labelMap"), ds.get("labelColumn")
            if label_map and col:
                rows = [r for r in rows if str(r.get(col)) in {str(k) for k in label_map}]
            note = f"rows of {ds['path']}/{f.name}" + (" with a label in labelMap" if label_map else "")
            if not ds.get("evalSplit"):
                return len(rows) - max(1, len(rows) // 10), note + ", less the held-out tenth"
            return len(rows), note
        return None, f"cannot count {base}: pass --samples"
    known = hub_datasets().get(str(ds.get("name") or ""))
    if known:
        window = f"{task.get('maxLength', 128)}/{task.get('docStride', 128)}"
        features = (known.get("features") or {}).get(window)
        if task.get("type") == "question-answering" and features:
            return int(features), f"{known['source']}: {features} windows at maxLength/docStride {window}"
        return int(known["rows"]), str(known["source"])
    return None, "unknown dataset size: set dataset.trainSamples or pass --samples"


def measured_tokens(cal: Calibration, model: str, dataset: str | None, max_length: int, batch: int) -> Any:
    """A record's measured padded length for this model, dataset and maxLength (the nearest batch size)."""
    if dataset is None:
        return None
    recs = [
        r
        for r in cal.records
        if r.workload.model == model and r.workload.dataset == dataset and r.workload.tokens_per_sample < max_length
    ]
    if not recs:
        return None
    return min(recs, key=lambda r: abs(r.workload.batch_per_device - batch))


def workload_of(
    job: dict[str, Any],
    cal: Calibration,
    *,
    model_config: dict[str, Any] | None = None,
    tokens: float | None = None,
    cwd: Path | None = None,
) -> tuple[Workload, list[str]]:
    """The job's work as the model sees it, and notes on what was assumed. `job` must have passed validate()."""
    spec = job["spec"]
    task = spec["task"]
    training = spec.get("training") or {}
    layout = resolve(job)
    p = layout.profile
    inst = layout.instance
    kind, per_rank = rank_share(layout)
    if kind is None:
        raise ValueError(f"profile {p.name} has no throughput data for {inst.name if inst else 'its default device'}")
    shape, shape_from = model_shape(str(task["model"]), model_config, cwd)
    lora_raw = task.get("lora")
    lora = Lora(int(lora_raw.get("r", 8)), tuple(lora_raw.get("targetModules") or ()) or None) if lora_raw else None
    max_length = int(task.get("maxLength", 128))
    batch = int(training.get("batchSizePerDevice", 8))
    notes = [f"model shape from {shape_from}"]
    ds = dataset_id(task)
    if p.backend == "neuron" or task["type"] in STATIC_PADDING_TASKS:
        tps = float(max_length)
        why = "Neuron compiles one graph per shape" if p.backend == "neuron" else "windows are padded"
        notes.append(f"tokens per sample {max_length}: padded to maxLength ({why})")
    elif tokens is not None:
        tps = float(tokens)
        notes.append(f"tokens per sample {tps:g} (--tokens-per-sample; rows that pad to maxLength use maxLength)")
    else:
        rec = measured_tokens(cal, str(task["model"]), ds, max_length, batch)
        if rec is not None:
            tps = rec.workload.tokens_per_sample
            notes.append(
                f"tokens per sample {tps:g}: each batch is padded to its longest row; the padded length measured "
                f"for this model and dataset (record {rec.id})"
            )
        else:
            tps = float(max_length)
            notes.append(
                f"tokens per sample {max_length}: each batch is padded to its longest row, which is not known here; "
                "maxLength is an upper bound (times are upper bounds); --tokens-per-sample sets the mean"
            )
    w = Workload(
        profile=p.name,
        device=kind.name,
        instance_type=inst.name if inst else None,
        nodes=layout.nodes,
        procs_per_node=layout.procs_per_node,
        devices_per_rank=per_rank,
        precision=str(training.get("precision", "fp32")),
        compile=bool(training.get("compile", False)) and p.backend != "neuron",
        model=str(task["model"]),
        shape=shape,
        lora=lora,
        tokens_per_sample=tps,
        batch_per_device=batch,
        grad_accum=int(training.get("gradientAccumulationSteps", 1)),
        dataset=ds,
    )
    return w, notes


# --- rows -------------------------------------------------------------------------------------------------------


def variants(job: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(profile, instance type, job) for one node of every instance type of every profile (the launcher, MPI and
    compile-cache settings of the original are dropped: each profile's defaults apply)."""
    out = []
    for p in profiles.load_all().values():
        for itype in sorted(p.instance_types):
            v = copy.deepcopy(job)
            spec = v["spec"]
            spec["hardware"] = {"profile": p.name, "instanceType": itype, "nodes": 1}
            for key in ("launcher", "mpi", "compileCache"):
                spec.pop(key, None)
            out.append((p.name, itype, v))
    return out


@dataclass(frozen=True)
class Row:
    label: str  # "as written" for the job itself
    profile: str
    instance_type: str | None
    nodes: int
    procs_per_node: int
    device: str | None
    prediction: Prediction | None
    samples: int | None  # samples the whole training processes (None: unknown)
    usd_per_hour: float | None  # all nodes
    price_note: str | None
    problem: str | None = None  # why there is no prediction

    @property
    def seconds(self) -> float | None:
        if self.prediction is None or self.samples is None:
            return None
        return self.samples / self.prediction.samples_per_second

    @property
    def cost(self) -> float | None:
        s = self.seconds
        return None if s is None or self.usd_per_hour is None else s / 3600.0 * self.usd_per_hour


@dataclass
class Estimate:
    job: str
    workload: Workload
    notes: list[str]
    samples_note: str
    rows: list[Row] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (profile, instance type, why)
    prices: Prices | None = None


def _total_samples(job: dict[str, Any], w: Workload, per_epoch: int | None) -> int | None:
    training = job["spec"].get("training") or {}
    if training.get("maxSteps"):
        return int(training["maxSteps"]) * w.world * w.batch_per_device * w.grad_accum
    if per_epoch is None:
        return None
    return round(float(training.get("epochs", 3)) * per_epoch)


def _row(
    label: str, job: dict[str, Any], cal: Calibration, prices: Prices, per_epoch: int | None, **kw: Any
) -> tuple[Row, Workload, list[str]]:
    w, notes = workload_of(job, cal, **kw)
    usd, price_note = prices.hourly(w.instance_type)
    total = None if usd is None else usd * w.nodes
    pred: Prediction | None = None
    problem: str | None = None
    if w.rank_peak is None:
        problem = f"no public {w.precision} peak for {w.device}"
    else:
        try:
            pred = predict(w, cal.fit(w))
        except ValueError as e:
            problem = str(e)
    row = Row(
        label=label,
        profile=w.profile,
        instance_type=w.instance_type,
        nodes=w.nodes,
        procs_per_node=w.procs_per_node,
        device=w.device,
        prediction=pred,
        samples=_total_samples(job, w, per_epoch),
        usd_per_hour=total,
        price_note=price_note,
        problem=problem,
    )
    return row, w, notes


def estimate(
    job: dict[str, Any],
    cal: Calibration,
    prices: Prices,
    *,
    model_config: dict[str, Any] | None = None,
    tokens: float | None = None,
    samples: int | None = None,
    cwd: Path | None = None,
    others: bool = True,
) -> Estimate:
    """Rows for the job as written and (others) for one node of every profile's instance types."""
    cwd = cwd or Path.cwd()
    per_epoch: int | None
    if samples is not None:
        per_epoch, samples_note = samples, "--samples"
    else:
        per_epoch, samples_note = samples_per_epoch(job, cwd)
    kw: dict[str, Any] = {"model_config": model_config, "tokens": tokens, "cwd": cwd}
    row, w, notes = _row("as written", job, cal, prices, per_epoch, **kw)
    est = Estimate(job["metadata"]["name"], w, notes, samples_note, [row], prices=prices)
    if not others:
        return est
    for profile, itype, v in variants(job):
        if (profile, itype, 1) == (w.profile, w.instance_type, w.nodes):
            continue
        try:
            valid = validate(v)
        except InvalidSpec as e:
            est.skipped.append((profile, itype, "; ".join(str(x) for x in e.errors)))
            continue
        r, _, _ = _row("", valid, cal, prices, per_epoch, **kw)
        est.rows.append(r)
    return est
