"""Each job's own location under a shared output.url or claim, the uid its pods get, and output.resumeFrom as the
pods reach it (docs/runtime.md, "The job's location")."""

from __future__ import annotations

from typing import Any

from ftjobs import make_job

from finetune_operator.admission import validate
from finetune_operator.builders import Names, SshKeys, desired, resolve
from finetune_operator.builders.env import derived_env, output_location
from finetune_operator.constants import OUTPUT_DIR, RESUME_FROM_DIR

KEYS = SshKeys("PRIVATE KEY\n", "ssh-ed25519 AAAA user\n", "HOST PRIVATE KEY\n", "ssh-ed25519 BBBB host\n")


def _job(name: str, uid: str, output: dict[str, Any]) -> dict[str, Any]:
    job = make_job(name, "team").classification().set("spec.output", output).set("metadata.uid", uid).build()
    return validate(job)


def _env(job: dict[str, Any]) -> dict[str, str]:
    layout = resolve(job)
    return derived_env(job, layout, Names.of(job, layout.launcher))


def _location(job: dict[str, Any]) -> str | None:
    return output_location(job, Names.of(job, resolve(job).launcher))


def test_jobs_sharing_an_output_url_each_get_their_own_location_and_uid() -> None:
    a = _job("a", "uid-a", {"url": "s3://bucket/shared/"})
    b = _job("b", "uid-b", {"url": "s3://bucket/shared"})
    assert _location(a) == "s3://bucket/shared/team/a/" and _location(b) == "s3://bucket/shared/team/b/"
    assert _env(a)["FTJOB_OUTPUT_URL"] == _location(a) and _env(b)["FTJOB_OUTPUT_URL"] == _location(b)
    assert _env(a)["FTJOB_JOB_UID"] == "uid-a" and _env(b)["FTJOB_JOB_UID"] == "uid-b"
    assert "FTJOB_RESUME_FROM" not in _env(a)


def test_a_claims_location_is_the_directory_its_pods_mount() -> None:
    job = _job("a", "uid-a", {"claimName": "results", "path": "bert-ja/"})
    assert _location(job) == "pvc://results/bert-ja/team/a/"
    assert "FTJOB_OUTPUT_URL" not in _env(job)
    pod = desired(job, ssh_keys=KEYS).pods[0]
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[OUTPUT_DIR]["subPath"] == "bert-ja/team/a" and RESUME_FROM_DIR not in mounts


def test_resume_from_reaches_the_pods_as_a_url_or_a_read_only_mount_of_the_same_claim() -> None:
    s3 = _job("c", "uid-c", {"url": "s3://bucket/shared", "resumeFrom": "s3://bucket/shared/team/a/"})
    assert _env(s3)["FTJOB_RESUME_FROM"] == "s3://bucket/shared/team/a/"
    claim = _job("c", "uid-c", {"claimName": "results", "resumeFrom": "pvc://results/team/a/checkpoints/uid-a"})
    assert _env(claim)["FTJOB_RESUME_FROM"] == RESUME_FROM_DIR
    for pod in desired(claim, ssh_keys=KEYS).pods:
        mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounts[RESUME_FROM_DIR] == {
            "name": "output",
            "mountPath": RESUME_FROM_DIR,
            "subPath": "team/a/checkpoints/uid-a",
            "readOnly": True,
        }


def test_status_reports_the_location() -> None:
    from datetime import datetime

    from finetune_operator.reconcile import Observed, reconcile

    job = _job("a", "uid-a", {"url": "s3://bucket/shared"}) | {"status": {}}
    plan = reconcile(job, Observed([], {}, datetime(2026, 12, 4), None, lambda: KEYS, None, {}))
    assert plan.status["output"] == {"location": "s3://bucket/shared/team/a/"}
