"""Measured runs (calibration records) and what they say about each (profile, precision, compile).

The throughput model (docs/estimate.md):

    compute   c = B · F / (E · P)          B samples per rank per micro-batch, F FLOPs per sample,
                                            P the rank's peak FLOP/s, E the efficiency (achieved / peak)
    micro     t = max(a, c)                 a: the step's floor (host launch and framework time, not compute)
    step      T = accumulation · t + k · 2(n−1)/n · G
                                            n ranks all-reduce G trained weights' gradients (ring), k seconds
                                            per gradient element
    samples/s = n · B · accumulation / T

E is fitted per (profile, precision, compile); the floor a per (profile, compile) across precisions (host
launch time does not depend on the number format); k per profile, from pairs of runs of one key at one and at
several ranks. Fits prefer records of the same model; other models of the key come next; a key with none is
"uncalibrated" and borrows (said in the row).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .. import profiles
from ..api.schema import PRECISIONS
from .flops import Counts, Lora, ModelShape
from .workload import Counted, Workload, _data, devices_per_rank_default, model_shape

# A step floor is claimed only where it explains the runs better than a purely compute-bound line by at least this
# much squared log error (one run off by about 10%): with one batch size per key (most records), or two runs of
# two parameters, a floor would otherwise fit anything exactly. Read by _fit_group.
_FLOOR_GAIN = 0.01
_TIE = 1e-12


def _kin(profile: str) -> list[list[str]]:
    """Profiles to borrow from when `profile` has no runs, nearest first: the same backend (trn2 from trn1), the
    same kind of hardware (accelerators: a rank per NeuronCore or GPU; CPUs), then any."""
    everything = profiles.load_all()
    me = everything[profile]

    def accel(p: profiles.Profile) -> bool:
        return p.procs_per in ("core", "device")

    same_backend = [n for n, p in everything.items() if p.backend == me.backend and n != profile]
    same_kind = [n for n, p in everything.items() if accel(p) == accel(me) and n != profile]
    return [same_backend, same_kind, [n for n in everything if n != profile]]


def ring(n: int) -> float:
    """Data a ring all-reduce sends per rank, in units of the buffer: 2(n−1)/n (0 for one rank)."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


@dataclass(frozen=True)
class Record:
    """One measured run: the work (a Workload) and its samples/s, with where the number comes from."""

    id: str
    workload: Workload
    samples_per_second: float
    source: str
    date: str | None = None
    machine: str | None = None
    note: str | None = None
    samples_per_epoch: int | None = None  # where the source reports epoch time rather than samples/s
    epoch_seconds: float | None = None
    acceptance: bool = False  # one of the figures docs/estimate.md predicts leave-one-out
    origin: str = "shipped"

    @property
    def step_seconds(self) -> float:
        """Measured time of one optimizer step (every rank's micro-batches, all-reduce included)."""
        w = self.workload
        return w.world * w.batch_per_device * w.grad_accum / self.samples_per_second


_KINDS = {str: "a string", int: "an integer", dict: "a mapping"}


def _field(raw: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
    v = raw.get(key)
    if v is None:
        if required:
            raise ValueError(f"{where}: {key} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, kind):
        what = _KINDS.get(kind, "a number") if isinstance(kind, type) else "a number"
        raise ValueError(f"{where}: {key} must be {what}, got {v!r}")
    return v


def parse_record(raw: Any, where: str, origin: str = "shipped") -> Record:
    """One record from its YAML/JSON mapping (format: docs/estimate.md, "Calibration records")."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a record is a mapping")
    rid = _field(raw, "id", where, str)
    where = f"{where} ({rid})"
    profile = _field(raw, "profile", where, str)
    if profile not in profiles.load_all():
        raise ValueError(f"{where}: profile {profile!r} is not one of {sorted(profiles.load_all())}")
    p = profiles.get(profile)
    tp = p.throughput
    if tp is None:
        raise ValueError(f"{where}: profile {profile} has no throughput data")
    itype = _field(raw, "instanceType", where, str, required=False)
    if itype is not None and itype not in p.instance_types:
        raise ValueError(f"{where}: instanceType {itype!r} is not an instance type of {profile}")
    device = _field(raw, "device", where, str, required=False)
    if device is None:
        kind = tp.device_for(itype)
        if kind is None:
            raise ValueError(f"{where}: give device (one of {sorted(tp.devices)}) or an instanceType")
        device = kind.name
    elif device not in tp.devices:
        raise ValueError(f"{where}: device {device!r} is not one of {sorted(tp.devices)}")
    per_rank = _field(raw, "devicesPerRank", where, (int, float), required=False)
    if per_rank is None:
        per_rank = devices_per_rank_default(profile)
        if per_rank is None:
            raise ValueError(f"{where}: devicesPerRank is required on {profile}: the {tp.unit}s each rank computes on")
    precision = _field(raw, "precision", where, str)
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: precision must be one of {PRECISIONS}")
    model = _field(raw, "model", where, str)
    inline = _field(raw, "modelConfig", where, dict, required=False)
    numbers = _field(raw, "modelNumbers", where, dict, required=False)
    counted = None
    try:
        shape: ModelShape | None = model_shape(model, inline)[0]
    except ValueError:
        if numbers is None:
            raise
        shape, counted = None, _counted(numbers, where)
    lora_raw = _field(raw, "lora", where, dict, required=False)
    lora = None
    if lora_raw:
        targets = lora_raw.get("targetModules")
        lora = Lora(int(lora_raw.get("r", 8)), tuple(targets) if targets else None)
    max_length = _field(raw, "maxLength", where, int)
    tokens = _field(raw, "tokensPerSample", where, (int, float), required=False)
    workload = Workload(
        profile=profile,
        device=device,
        instance_type=itype,
        nodes=_field(raw, "nodes", where, int, required=False) or 1,
        procs_per_node=_field(raw, "procsPerNode", where, int, required=False) or 1,
        devices_per_rank=float(per_rank),
        precision=precision,
        compile=bool(raw.get("compile", False)),
        model=model,
        shape=shape,
        lora=lora,
        tokens_per_sample=float(tokens if tokens is not None else max_length),
        batch_per_device=_field(raw, "batchSizePerDevice", where, int),
        grad_accum=_field(raw, "gradientAccumulationSteps", where, int, required=False) or 1,
        dataset=_field(raw, "dataset", where, str, required=False),
        counted=counted,
    )
    sps = _field(raw, "samplesPerSecond", where, (int, float), required=False)
    per_epoch = _field(raw, "samplesPerEpoch", where, int, required=False)
    epoch_s = _field(raw, "epochSeconds", where, (int, float), required=False)
    if sps is None:
        if per_epoch is None or epoch_s is None:
            raise ValueError(f"{where}: give samplesPerSecond, or samplesPerEpoch and epochSeconds")
        sps = per_epoch / epoch_s
    if sps <= 0:
        raise ValueError(f"{where}: samplesPerSecond must be positive")
    if workload.rank_peak is None:
        raise ValueError(f"{where}: {device} has no peak for {precision}: the run cannot calibrate an efficiency")
    source = _field(raw, "source", where, str)
    return Record(
        id=rid,
        workload=workload,
        samples_per_second=float(sps),
        source=" ".join(source.split()),
        date=str(raw["date"]) if raw.get("date") is not None else None,
        machine=raw.get("machine"),
        note=" ".join(str(raw["note"]).split()) if raw.get("note") else None,
        samples_per_epoch=per_epoch,
        epoch_seconds=float(epoch_s) if epoch_s is not None else None,
        acceptance=bool(raw.get("acceptance", False)),
        origin=origin,
    )


def _counted(numbers: dict[str, Any], where: str) -> Counted:
    """modelNumbers (a FineTuneJob's status.throughput.model: the model as its run counted it) -> Counted."""
    keys = ("layers", "attentionWidth", "trainableMatmulParams", "frozenMatmulParams", "trainableParams")
    values = [numbers.get(k) for k in keys]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{where}: modelNumbers needs whole numbers {', '.join(keys)}")
    layers, width, trained_matmul, frozen, trained = (int(v) for v in values)  # type: ignore[arg-type]
    return Counted(Counts(layers, width, trained_matmul, frozen), trained)


def parse_records(doc: Any, where: str, origin: str) -> list[Record]:
    items = doc.get("records") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise ValueError(f"{where}: expected a list of records (or a mapping with a `records` list)")
    out = [parse_record(item, f"{where} record {i}", origin) for i, item in enumerate(items)]
    seen: set[str] = set()
    for r in out:
        if r.id in seen:
            raise ValueError(f"{where}: two records have id {r.id!r}")
        seen.add(r.id)
    return out


def shipped_records() -> list[Record]:
    """The records kept with the package (estimate/calibration.yaml)."""
    return parse_records(_data("calibration.yaml"), "estimate/calibration.yaml", "shipped")


def load_records(paths: Iterable[str | Path] = (), shipped: bool = True) -> list[Record]:
    """The shipped records plus those in each file (YAML or JSON); a file's record replaces a shipped one of the
    same id (a newer measurement of the same run)."""
    by_id = {r.id: r for r in (shipped_records() if shipped else [])}
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not YAML or JSON: {e}") from None
        for r in parse_records(doc, str(path), str(path)):
            by_id[r.id] = r
    return list(by_id.values())


# --- fitting ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """What the calibration says about one workload's key."""

    efficiency: float
    floor: float  # seconds per micro-batch step, 0 where no run shows one
    k: float  # seconds per gradient element of a ring all-reduce
    runs: int  # measured runs behind the efficiency (0: uncalibrated)
    same_model: bool
    calibrated: bool
    basis: list[str] = field(default_factory=list)  # what was borrowed or assumed, in words
    record_ids: tuple[str, ...] = ()


def _ideal(w: Workload) -> float:
    """Seconds one micro-batch of one rank takes at 100% of peak."""
    peak = w.rank_peak
    assert peak is not None
    return w.batch_per_device * w.flops_per_sample / peak


def _micro(r: Record, k: float) -> float:
    """The record's measured micro-batch time with its all-reduce taken out."""
    w = r.workload
    comm = k * ring(w.world) * w.trained_params
    return max(1e-9, (r.step_seconds - comm) / w.grad_accum)


def _fit_group(points: list[tuple[str, float, float]]) -> tuple[float, dict[str, float]]:
    """Least squares in log time of t = max(a, d/E) over (precision, ideal d, measured t): the floor a shared,
    one E per precision. Candidates: a in {0} ∪ measured times, E in the measured efficiencies d/t."""
    best: tuple[float, float, dict[str, float]] | None = None
    by_p: dict[str, list[tuple[float, float]]] = {}
    for prec, d, t in points:
        by_p.setdefault(prec, []).append((d, t))
    for a in sorted({0.0, *(t for _, _, t in points)}):
        total = 0.0
        effs: dict[str, float] = {}
        for prec, pts in by_p.items():
            choice: tuple[float, float] | None = None
            for e in sorted({d / t for d, t in pts}):
                loss = sum((math.log(max(a, d / e)) - math.log(t)) ** 2 for d, t in pts)
                if choice is None or loss < choice[0] - _TIE:
                    choice = (loss, e)
            assert choice is not None
            total += choice[0]
            effs[prec] = choice[1]
        penalty = _FLOOR_GAIN if a > 0 else 0.0
        if best is None or total + penalty < best[0] - _TIE:
            best = (total + penalty, a, effs)
    assert best is not None
    return best[1], best[2]


class Calibration:
    """Records, and fits of them on demand."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.k_by_profile, self.k_pairs = self._fit_k()

    def without(self, record_id: str) -> Calibration:
        return Calibration([r for r in self.records if r.id != record_id])

    def _group_fit(self, recs: list[Record], k: float) -> tuple[float, dict[str, float]]:
        return _fit_group([(r.workload.precision, _ideal(r.workload), _micro(r, k)) for r in recs])

    def _fit_k(self) -> tuple[dict[str, float], dict[str, list[str]]]:
        """k per profile from runs at several ranks whose key also has single-rank runs."""
        ks: dict[str, list[float]] = {}
        pairs: dict[str, list[str]] = {}
        singles = [r for r in self.records if r.workload.world == 1]
        for r in self.records:
            w = r.workload
            if w.world == 1:
                continue
            group = [s for s in singles if (s.workload.profile, s.workload.compile) == (w.profile, w.compile)]
            if not any(s.workload.precision == w.precision for s in group):
                continue
            same = [s for s in group if s.workload.model == w.model]
            group = same if any(s.workload.precision == w.precision for s in same) else group
            a, effs = self._group_fit(group, 0.0)
            compute = max(a, _ideal(w) / effs[w.precision]) * w.grad_accum
            elems = ring(w.world) * w.trained_params
            ks.setdefault(w.profile, []).append(max(0.0, (r.step_seconds - compute) / elems) if elems else 0.0)
            pairs.setdefault(w.profile, []).append(r.id)
        return {p: statistics.median(v) for p, v in ks.items()}, pairs

    def k_for(self, profile: str) -> tuple[float, str | None]:
        """Seconds per all-reduced gradient element on this profile, and what was borrowed, if anything."""
        if profile in self.k_by_profile:
            return self.k_by_profile[profile], None
        for group in _kin(profile):
            ks = [self.k_by_profile[p] for p in group if p in self.k_by_profile]
            if ks:
                names = ", ".join(p for p in group if p in self.k_by_profile)
                return statistics.median(
                    ks
                ), f"no multi-rank runs on {profile}: the all-reduce cost measured on {names}"
        return 0.0, "no multi-rank runs anywhere: all-reduce cost taken as zero"

    def fit(self, w: Workload) -> Fit:
        k, k_note = self.k_for(w.profile)
        basis = [k_note] if k_note else []
        keyed = [r for r in self.records if r.workload.key == w.key]
        if keyed:
            return self._fit_from(w, keyed, k, basis)
        other = [
            r
            for r in self.records
            if (r.workload.profile, r.workload.precision) == (w.profile, w.precision)
            and r.workload.compile != w.compile
        ]
        if other:
            mode = "compiled" if other[0].workload.compile else "eager"
            basis.append(f"no {'compiled' if w.compile else 'eager'} runs at {w.precision}: the {mode} runs' fit")
            return self._fit_from(replace(w, compile=other[0].workload.compile), other, k, basis)
        # Uncalibrated: the efficiency of the nearest calibrated profiles at this precision (same backend, else
        # the same kind of hardware, else any), eager runs first; no floor.
        for group in _kin(w.profile):
            keys = sorted(
                {
                    r.workload.key
                    for r in self.records
                    if r.workload.profile in group and r.workload.precision == w.precision
                },
                key=lambda key: (key[2] != w.compile, key),
            )
            if not keys:
                continue
            keys = [key for key in keys if key[2] == keys[0][2]]
            effs = []
            for key in keys:
                recs = [r for r in self.records if r.workload.key == key]
                _, by_precision = self._group_fit(recs, self.k_for(key[0])[0])
                effs.append(by_precision[w.precision])
            eff = statistics.median(effs)
            names = ", ".join(sorted({key[0] for key in keys}))
            basis.append(
                f"uncalibrated: no runs on {w.profile} at {w.precision}; efficiency {eff:.1%} of {names} assumed"
            )
            return Fit(eff, 0.0, k, 0, False, False, basis)
        raise ValueError(f"no calibration record at {w.precision} at all: nothing to assume an efficiency from")

    def _fit_from(self, w: Workload, keyed: list[Record], k: float, basis: list[str]) -> Fit:
        same = [r for r in keyed if r.workload.model == w.model]
        chosen_key = same or keyed
        models = {r.workload.model for r in chosen_key}
        group = [
            r
            for r in self.records
            if (r.workload.profile, r.workload.compile) == (w.profile, w.compile)
            and (not same or r.workload.model == w.model)
        ]
        floor, effs = self._group_fit(group, k)
        if not same:
            basis.append(f"no runs of {w.model} here: efficiency of {', '.join(sorted(models))}")
        if floor == 0.0:
            others = [r for r in self.records if r.workload.profile == w.profile and r.workload.compile != w.compile]
            if others:
                borrowed, _ = self._group_fit(others, k)
                if borrowed > 0:
                    mode = "compiled" if others[0].workload.compile else "eager"
                    basis.append(f"no step floor shown by these runs: the {mode} runs' {borrowed * 1e3:.1f} ms")
                    floor = borrowed
        return Fit(
            efficiency=effs[w.precision],
            floor=floor,
            k=k,
            runs=len(chosen_key),
            same_model=bool(same),
            calibrated=True,
            basis=basis,
            record_ids=tuple(r.id for r in chosen_key),
        )


@dataclass(frozen=True)
class Prediction:
    samples_per_second: float
    step_seconds: float
    mfu: float
    fit: Fit


def predict(w: Workload, fit: Fit) -> Prediction:
    """Samples/s of the workload under the fit (module docstring)."""
    peak = w.rank_peak
    if peak is None:
        raise ValueError(f"{w.device} has no public {w.precision} peak: no prediction")
    compute = w.batch_per_device * w.flops_per_sample / (fit.efficiency * peak)
    step = w.grad_accum * max(fit.floor, compute) + fit.k * ring(w.world) * w.trained_params
    sps = w.world * w.batch_per_device * w.grad_accum / step
    return Prediction(sps, step, sps * w.flops_per_sample / (w.world * peak), fit)
