"""benchmarks/benchio.py `scratch`: a cluster benchmark's folder (etcd data, audit log) goes when the run succeeds
and stays, named, when it fails or when asked to."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from benchio import scratch


@pytest.fixture(autouse=True)
def _own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_a_successful_run_leaves_nothing(tmp_path: Path) -> None:
    with scratch("b-", keep=False) as work:
        (work / "etcd").mkdir()
        (work / "etcd" / "db").write_bytes(b"x" * 1024)
        assert work.parent == tmp_path
    assert not work.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_keeps_its_folder_and_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), scratch("b-", keep=False) as work:
        (work / "audit.log").write_text("{}")
        raise RuntimeError("the API server did not start")
    assert (work / "audit.log").exists()
    assert str(work) in capsys.readouterr().err


def test_keep_work_keeps_a_successful_runs_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with scratch("b-", keep=True) as work:
        pass
    assert work.is_dir()
    assert str(work) in capsys.readouterr().out
