"""What the e2e nodes' image stores drop before an import (ftjob_cluster.node.stale_names): every build of the
image's repository under any of its names, and nothing of another repository."""

from __future__ import annotations

from ftjob_cluster.node import repository_of, stale_names

OLD, OTHER_TAG, OPERATOR = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
ROWS = [
    ["docker.io/finetune-operator/cpu:old", "application/vnd.docker.distribution.manifest.v2+json", OLD, "6.6GiB"],
    ["docker.io/finetune-operator/cpu:failures", "application/vnd.docker.distribution.manifest.v2+json", OTHER_TAG],
    ["docker.io/finetune-operator/cpu@sha256:" + "a" * 64, "application/vnd.docker.distribution.manifest.v2+json", OLD],
    ["sha256:" + "b" * 64, "application/vnd.docker.distribution.manifest.v2+json", OLD],
    ["docker.io/finetune-operator/operator:dev", "application/vnd.docker.distribution.manifest.v2+json", OPERATOR],
    ["sha256:" + "c" * 64, "application/vnd.docker.distribution.manifest.v2+json", OPERATOR],
]


def test_repository_of_strips_tag_and_digest_but_not_a_registry_port() -> None:
    assert repository_of("docker.io/finetune-operator/cpu:old") == "docker.io/finetune-operator/cpu"
    assert repository_of("docker.io/finetune-operator/cpu@sha256:" + "a" * 64) == "docker.io/finetune-operator/cpu"
    assert repository_of("localhost:5000/finetune-operator/cpu:1") == "localhost:5000/finetune-operator/cpu"
    assert repository_of("sha256:" + "b" * 64) == "sha256"


def test_every_build_of_the_repository_goes_with_all_its_names_and_no_other_image() -> None:
    got = stale_names("docker.io/finetune-operator/cpu:old", ROWS)
    assert got == [row[0] for row in ROWS[:4]]
    assert stale_names("docker.io/finetune-operator/operator:dev", ROWS) == [ROWS[4][0], ROWS[5][0]]
    assert stale_names("docker.io/finetune-operator/nvidia:dev", ROWS) == []
