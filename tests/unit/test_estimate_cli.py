"""`ftjob estimate`: the table for the trn1 and xeon samples, --json, the job's validation (the same as render's),
and docs/estimate.md's generated sections (peaks, leave-one-out) against what the code computes now."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finetune_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["estimate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_trn1_sample_prints_the_table_with_calibration_and_prices(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    rc, out, _ = run(capsys, "-f", "manifests/samples/trn1-bert-ja-2core-bf16.yaml")
    assert rc == 0
    lines = out.splitlines()
    written = next(line for line in lines if "trn1.2xlarge *" in line)
    # as written: 2 NeuronCores of one trn1.2xlarge, bf16: the seed's 149.1 samples/s, backed by the 2 bf16 runs
    assert "1 x 2" in written and "149.1" in written and "2 runs" in written and "$1.34" in written
    # 4,000 samples x 10 epochs at 149.1 samples/s: 4.5 minutes
    assert "4.5 min" in written
    # every other profile's instance types get a row; trn2 has no runs and says so
    for itype in ("trn1.32xlarge", "p5.48xlarge", "p5en.48xlarge", "m7i.metal-48xl", "trn2.48xlarge", "m7i.xlarge"):
        assert any(itype in line for line in lines), itype
    trn2 = next(line for line in lines if "trn2.48xlarge" in line)
    assert "uncalibrated" in trn2
    assert "no public bf16 peak for A10G" in out
    assert "precompile" in out and "not counted" in out
    assert "read 2026-12-04" in out


def test_xeon_sample_as_written_is_the_seeds_4_node_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    rc, out, _ = run(capsys, "-f", "manifests/samples/xeon-distilbert-squad.yaml", "--as-written")
    assert rc == 0
    row = next(line for line in out.splitlines() if "m7i.metal-48xl *" in line)
    assert "4 x 2" in row and "2 runs" in row
    assert "88524 windows" in out  # SQuAD at maxLength 384, docStride 128


def test_json_gives_the_same_rows_as_data(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    rc, out, _ = run(capsys, "-f", "manifests/samples/trn1-bert-ja-1core-fp32.yaml", "--json")
    assert rc == 0
    doc = json.loads(out)
    first = doc["rows"][0]
    assert first["label"] == "as written" and first["instanceType"] == "trn1.2xlarge"
    # the fit of both fp32 runs (one core and two) with the all-reduce between them: near, not equal, to 68.4
    assert first["samplesPerSecond"] == pytest.approx(68.4, rel=0.05)
    assert first["calibration"]["runs"] == 2
    assert sorted(first["calibration"]["records"]) == ["trn1-bert-ja-1core-fp32", "trn1-bert-ja-2core-fp32"]
    assert first["seconds"] == pytest.approx(4000 * 10 / 68.4, rel=1e-3)
    assert first["costUsd"] == pytest.approx(first["seconds"] / 3600 * 1.34375, rel=1e-3)
    assert doc["workload"]["flopsPerSample"] == 67_041_755_136
    assert doc["prices"]["date"] == "2026-12-04"
    assert "precompile" in doc["timeCovers"]
    uncalibrated = [r for r in doc["rows"] if r["calibration"] and not r["calibration"]["calibrated"]]
    assert uncalibrated and all(r["calibration"]["runs"] == 0 for r in uncalibrated)


def test_invalid_job_is_refused_as_render_refuses_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    bad = yaml.safe_load((ROOT / "manifests/samples/trn1-bert-ja-2core-bf16.yaml").read_text())
    bad["spec"]["hardware"]["procsPerNode"] = 3  # trn1 places 1, 2, 8, 16 or 32
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    rc, out, err = run(capsys, "-f", str(f))
    assert rc == 1 and out == ""
    assert "spec.hardware.procsPerNode" in err
    render = main(["render", "-f", str(f)])
    assert render == 1
    assert capsys.readouterr().err.splitlines()[1:] == err.splitlines()[1:]


def test_unknown_model_names_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    j = yaml.safe_load((ROOT / "manifests/samples/cpu-bert-ja.yaml").read_text())
    j["spec"]["task"]["model"] = "someone/private-bert"
    f = tmp_path / "j.yaml"
    f.write_text(yaml.safe_dump(j))
    rc, _, err = run(capsys, "-f", str(f))
    assert rc == 1 and "--model-config" in err
    cfg = tmp_path / "config.json"
    cfg.write_text((ROOT / "examples/models/tiny-bert-ja/config.json").read_text())
    rc, out, _ = run(capsys, "-f", str(f), "--model-config", str(cfg), "--as-written")
    assert rc == 0 and "model shape from the config given" in out


def test_bad_calibration_file_is_an_error_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump([{"id": "x", "profile": "trn1"}]))
    rc, _, err = run(capsys, "-f", "manifests/samples/trn1-bert-ja-2core-bf16.yaml", "--calibration", str(f))
    assert rc == 1 and str(f) in err and "record 0 (x): precision is required" in err


def test_console_script_runs(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "ftjob"
    p = subprocess.run(
        [str(exe), "estimate", "-f", "manifests/samples/trn1-bert-ja-1core-bf16.yaml", "--as-written"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "trn1.2xlarge *" in p.stdout and "2 runs" in p.stdout


def test_docs_generated_sections_are_current() -> None:
    """docs/estimate.md's peak table and leave-one-out table come from the code: `python hack/estimate_doc.py`."""
    p = subprocess.run(
        [sys.executable, "hack/estimate_doc.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
