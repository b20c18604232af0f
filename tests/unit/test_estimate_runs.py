"""A job that ran is a calibration record (estimate/runs.py): a Succeeded FineTuneJob's spec and status.throughput
become one measured run, which the next `ftjob estimate` of that model and hardware uses ("uncalibrated" before,
"1 run" after). Jobs that did not succeed, `spec.command` jobs and jobs without measured throughput give none, and
say why."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from ftjobs import make_job

from finetune_operator.admission import validate
from finetune_operator.builders import resolve
from finetune_operator.cli import main
from finetune_operator.estimate import Calibration, estimate, load_prices
from finetune_operator.estimate.calibration import parse_record
from finetune_operator.estimate.runs import RUN_ORIGIN, load_calibration, record_from_job
from finetune_operator.estimate.workload import rank_share

BERT_JA = "cl-tohoku/bert-base-japanese-whole-word-masking"
NUMBERS = {
    "layers": 12,
    "attentionWidth": 768,
    "trainableMatmulParams": 84_934_656 + 768 * 768 + 768 * 2,
    "frozenMatmulParams": 0,
    "trainableParams": 110_618_882,
}


def bert_on_cpu(name: str = "bert-cpu") -> dict[str, Any]:
    """BERT-base on the cpu profile in bf16: the shipped calibration has no run there ("uncalibrated")."""
    job = make_job(name, "ml").profile("cpu").classification(model=BERT_JA).training(precision="bf16").build()
    job["spec"]["task"]["dataset"]["trainSamples"] = 1000
    return job


def ran(job: dict[str, Any], **throughput: Any) -> dict[str, Any]:
    """The job as the API server holds it after it Succeeded, with what its rank 0 measured."""
    out = copy.deepcopy(job)
    out["metadata"]["uid"] = f"uid-{job['metadata']['name']}"
    measured = {
        "samplesPerSecond": 0.52,
        "meanSamplesPerSecond": 0.5,
        "paddedTokensPerSample": 61.5,
        "precision": "bf16",
        "model": NUMBERS,
        **throughput,
    }
    out["status"] = {"phase": "Succeeded", "completionTime": "2026-12-05T10:00:00Z", "throughput": measured}
    return out


def calibration_label(job: dict[str, Any], jobs: list[dict[str, Any]]) -> str:
    records, _ = load_calibration(jobs=jobs)
    est = estimate(validate(job), Calibration(records), load_prices(None), others=False)
    pred = est.rows[0].prediction
    assert pred is not None
    fit = pred.fit
    return "uncalibrated" if not fit.calibrated else f"calibrated, {fit.runs} run" + ("s" if fit.runs != 1 else "")


def test_a_job_that_ran_turns_uncalibrated_into_calibrated_one_run() -> None:
    job = bert_on_cpu()
    assert calibration_label(job, []) == "uncalibrated"
    assert calibration_label(job, [ran(job)]) == "calibrated, 1 run"
    assert calibration_label(job, [ran(job), ran(bert_on_cpu("again"))]) == "calibrated, 2 runs"


def test_the_record_describes_the_work_as_the_estimate_does() -> None:
    job = ran(bert_on_cpu())
    rec, why = record_from_job(job)
    assert why is None and rec is not None
    layout = resolve(validate(bert_on_cpu()))
    kind, per_rank = rank_share(layout)
    assert kind is not None
    assert rec["id"] == "ml/bert-cpu (uid-bert-cpu)"
    assert (rec["profile"], rec["device"], rec["devicesPerRank"], rec["precision"]) == (
        "cpu",
        kind.name,
        per_rank,
        "bf16",
    )
    assert (rec["model"], rec["tokensPerSample"], rec["samplesPerSecond"]) == (BERT_JA, 61.5, 0.5)  # the run's mean
    assert rec["date"] == "2026-12-05" and "meanSamplesPerSecond" in rec["source"]
    parsed = parse_record(rec, "test", RUN_ORIGIN + "test")
    # The model's config is known here (models.yaml): the record computes its FLOPs like the estimate does.
    assert parsed.workload.shape is not None and parsed.workload.counted is None


def test_a_model_without_a_config_here_uses_the_numbers_its_run_counted() -> None:
    job = bert_on_cpu()
    job["spec"]["task"]["model"] = "/cache/models/private-bert"  # a path inside the pods only
    rec, _ = record_from_job(ran(job))
    assert rec is not None
    w = parse_record(rec, "test", "test").workload
    assert w.shape is None and w.counted is not None
    assert w.trained_params == NUMBERS["trainableParams"]
    s = 61.5
    assert w.flops_per_sample == s * (6 * NUMBERS["trainableMatmulParams"] + 12 * 12 * 768 * s)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda j: j["status"].update(phase="Failed"), "not Succeeded"),
        (lambda j: j["status"].pop("throughput"), "no samples/s"),
        (lambda j: j["status"]["throughput"].pop("paddedTokensPerSample"), "no samples/s and padded tokens"),
    ],
)
def test_jobs_that_give_no_record_say_why(change: Any, reason: str) -> None:
    job = ran(bert_on_cpu())
    change(job)
    rec, why = record_from_job(job)
    assert rec is None and why is not None and reason in why and "ml/bert-cpu" in why


def test_a_command_job_gives_no_record() -> None:
    job = make_job("byo", "ml").command("python", "train.py").build()
    job["status"] = {"phase": "Succeeded", "throughput": {"samplesPerSecond": 3.0}}
    rec, why = record_from_job(job)
    assert rec is None and why is not None and "spec.command" in why


def test_a_device_without_a_public_peak_is_skipped_not_an_error() -> None:
    job = bert_on_cpu("a10")
    job["spec"]["hardware"] = {"profile": "nvidia", "instanceType": "g5.xlarge"}
    records, skipped = load_calibration(jobs=[ran(job)])
    assert not [r for r in records if r.origin.startswith(RUN_ORIGIN)]
    assert len(skipped) == 1 and "no peak for bf16" in skipped[0]


def test_cli_reads_a_saved_kubectl_list_from_a_file_and_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job = bert_on_cpu()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    listed = {"apiVersion": "v1", "kind": "List", "items": [ran(job), ran(make_job("byo", "ml").command("x").build())]}
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(listed))

    def row(*args: str) -> tuple[str, str]:
        assert main(["estimate", "-f", str(tmp_path / "job.yaml"), "--as-written", *args]) == 0
        out = capsys.readouterr()
        return next(line for line in out.out.splitlines() if line.startswith("cpu")), out.err

    line, _ = row()
    assert "uncalibrated" in line
    line, err = row("--calibration", str(tmp_path / "runs.yaml"))
    assert " 1 run" in line and "uncalibrated" not in line, line
    assert "calibration: 1 measured run(s) of FineTuneJobs" in err and "ml/byo: a spec.command job" in err
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(listed)))
    line, _ = row("--calibration", "-")
    assert " 1 run" in line and "uncalibrated" not in line, line
