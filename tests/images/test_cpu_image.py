"""Smoke test of the built cpu image (FTJOB_TEST_IMAGE, default ftjob/cpu:dev): what a rank pod relies on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import FTJOB_UID, REPO, Docker, requirement_pins

REQUIREMENTS = REPO / "images" / "cpu" / "requirements.txt"


def _sh(docker: Docker, image: str, script: str, *extra: str, timeout: float = 120) -> str:
    return docker.run(["run", "--rm", *extra, image, "bash", "-c", script], timeout=timeout).stdout


def test_runs_as_fixed_non_root_user(docker: Docker, image: str) -> None:
    out = _sh(
        docker, image, 'id -u; id -g; id -un; echo "$HOME"; touch "$HOME/x" /output/x /cache/x && echo w'
    )
    assert out.split() == [str(FTJOB_UID), str(FTJOB_UID), "ftjob", "/home/ftjob", "w"]
    config = json.loads(docker.run(["image", "inspect", "--format", "{{json .Config}}", image]).stdout)
    # Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert config["User"] == f"{FTJOB_UID}:{FTJOB_UID}"
    assert config["Cmd"] == ["ftjob-runtime", "selfcheck"]


def test_pinned_stack_and_labels(docker: Docker, image: str) -> None:
    pins = requirement_pins(REQUIREMENTS)
    out = _sh(
        docker,
        image,
        "python - <<'PY'\n"
        "import importlib.metadata as m, json\n"
        f"print(json.dumps({{n: m.version(n) for n in {sorted(pins)!r}}}))\n"
        "PY",
    )
    installed = json.loads(out)
    for name, version in pins.items():
        # The CPU index adds a local label (2.15.0+cpu); PyPI's build has none.
        assert installed[name].split("+")[0] == version, (name, installed[name])
    labels = json.loads(docker.run(["image", "inspect", "--format", "{{json .Config.Labels}}", image]).stdout)
    assert labels["dev.finetune.versions.torch"] == pins["torch"]
    assert labels["dev.finetune.versions.transformers"] == pins["transformers"]
    assert labels["org.opencontainers.image.version"]


def test_system_tools_present(docker: Docker, image: str) -> None:
    out = _sh(
        docker,
        image,
        'set -e; test -r "$FTJOB_TCMALLOC"; '
        'mpirun.mpich -n 2 -launcher fork python -c \'import os; print("rank", os.environ["PMI_RANK"])\'; '
        "/usr/sbin/sshd -V 2>&1 | head -n1; test -d /run/sshd && echo sshd-dir",
    )
    assert sorted(re.findall(r"rank \d", out)) == ["rank 0", "rank 1"]
    assert "OpenSSH" in out and "sshd-dir" in out


def test_build_ca_not_left_in_image(docker: Docker, image: str) -> None:
    """The build trusts the host's bundle (proxy CA included) only through a BuildKit secret."""
    out = _sh(
        docker,
        image,
        'test ! -e /run/secrets/ca && echo no-secret; env | grep -E "^(SSL_CERT_FILE|PIP_CERT|'
        'REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=" || true; ls /usr/local/share/ca-certificates | wc -l; '
        "cat /etc/ssl/certs/ca-certificates.crt; "
        # certifi is only there when some dependency pulls it in.
        'python -c "import certifi; print(open(certifi.where()).read())" 2>/dev/null || true',
    )
    lines = out.splitlines()
    assert lines[0] == "no-secret"
    assert lines[1] == "0", "site-local CAs were installed into the image"
    # Site-local CAs of the build host (an intercepting proxy's CA lives there) must be in no bundle.
    local_cas = sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    for ca in local_cas:
        body = "".join(ca.read_text(encoding="utf-8").split("-----")[2].split())
        assert body[:200] not in "".join(out.split()), f"{ca} ended up in the image"
