"""docs/eks.md stays copyable: the files it writes with heredocs are valid, and it only uses what it defines.

No AWS account here, so eksctl/aws commands are not run; what can be checked offline is: the Helm values it
writes render the chart, the Kubernetes objects validate against the pinned OpenAPI schema, the FineTuneJob
passes the operator's own validation (`ftjob render`), and every shell variable is set before use.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartlib import CHART, RELEASE, REPO, find, load_all, one

DOC = REPO / "docs" / "eks.md"
# Example values for the variables the guide sets from AWS answers (account id, file system id, ...).
EXAMPLE_ENV = {
    "CLUSTER": "finetune",
    "REGION": "us-west-2",
    "EKS_VERSION": "1.34",
    "ACCOUNT_ID": "123456789012",
    "ECR": "123456789012.dkr.ecr.us-west-2.amazonaws.com",
    "TAG": "0.1.0",
    "BUCKET": "finetune-results-123456789012",
    "JOBS_NS": "ml",
    "AZ": "us-west-2d",
    "AZ2": "us-west-2a",
    "EFS_ID": "fs-0123456789abcdef0",
}
HEREDOC = re.compile(r"^cat > (?P<name>\S+) <<(?P<quote>'?)EOF\n(?P<body>.*?)^EOF$", re.M | re.S)


def bash_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(), re.M | re.S)


def heredocs() -> dict[str, str]:
    """name -> body with ${VAR} expanded as bash would (unquoted EOF) from EXAMPLE_ENV."""
    out = {}
    for block in bash_blocks():
        for m in HEREDOC.finditer(block):
            body = m["body"]
            if not m["quote"]:
                body = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda v: EXAMPLE_ENV[v[1] or v[2]], body)
            out[m["name"]] = body
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    found = heredocs()
    expected = {"cluster.yaml", "efs-sc.yaml", "claims.yaml", "s3-policy.json", "values-eks.yaml",
                "bert-ja-trn1-2x32.yaml"}  # fmt: skip
    assert expected <= set(found), f"docs/eks.md no longer writes {expected - set(found)}"
    return found


def test_every_variable_is_set_before_use() -> None:
    """A reader pasting block after block never hits an unset variable."""
    defined: set[str] = set()
    for block in bash_blocks():
        text = HEREDOC.sub(lambda m: m.group(0).replace(m["body"], m["body"] if not m["quote"] else ""), block)
        for line in text.splitlines():
            for name in re.findall(r"(?:^|[\s;])(?:export\s+)?([A-Z][A-Z0-9_]*)=", line):
                defined.add(name)
            for loop_var in re.findall(r"\bfor (\w+) in\b", line):
                defined.add(loop_var)
            for used in re.findall(r"\$\{?([A-Za-z_]\w*)", line):
                if used in {"IMAGE_TAG"}:  # set inline for build.sh on the same line
                    continue
                assert used in defined, f"${used} is used before it is set in: {line.strip()}"


def test_values_file_renders_the_chart_in_namespaced_mode(files: dict[str, str], helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values-eks.yaml"
    values.write_text(files["values-eks.yaml"])
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "-n", "finetune-operator", "-f", str(values)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    objs = load_all(out.stdout)
    ecr = EXAMPLE_ENV["ECR"]
    container = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{ecr}/finetune-operator/operator:0.1.0"
    assert "--namespace=ml" in container["args"]
    assert [r["metadata"]["namespace"] for r in find(objs, "Role")] == ["ml"]
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    assert config["images"]["trn1"] == f"{ecr}/finetune-operator/neuron:0.1.0"
    claim = one(objs, "PersistentVolumeClaim", "finetune-cache", "ml")
    assert claim["spec"]["storageClassName"] == "efs-sc"
    assert yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])["networkPolicy"]["enabled"] is True


@pytest.mark.parametrize("name", ["efs-sc.yaml", "claims.yaml"])
def test_kubernetes_objects_validate(files: dict[str, str], k8s_version: str, name: str) -> None:
    objs = load_all(files[name])
    assert objs
    for obj in objs:
        kubernetes_validate.validate(obj, k8s_version, strict=True)


def test_claims_match_what_the_samples_and_the_chart_use(files: dict[str, str]) -> None:
    """Every claim a sample the guide applies names exists: from claims.yaml or the chart's cachePVC."""
    created = {o["metadata"]["name"] for o in load_all(files["claims.yaml"])}
    created.add(yaml.safe_load(files["values-eks.yaml"])["cachePVC"]["name"])
    sc = load_all(files["efs-sc.yaml"])[0]
    for claim in load_all(files["claims.yaml"]):
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert claim["spec"]["storageClassName"] == sc["metadata"]["name"]
    applied = re.findall(r"apply -f (manifests/samples/\S+\.yaml)", DOC.read_text())
    assert applied
    for path in applied:
        job: dict[str, Any] = yaml.safe_load((REPO / path).read_text())
        for block in ("compileCache", "output"):
            claim_name = job["spec"].get(block, {}).get("claimName")
            assert claim_name is None or claim_name in created, f"{path}: claim {claim_name} is never created"


def test_finetunejob_passes_the_operators_validation(files: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(files["bert-ja-trn1-2x32.yaml"])
    ftjob = Path(sys.executable).with_name("ftjob")
    out = subprocess.run([str(ftjob), "render", "-f", str(job), "-n", "ml"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    pods = [o for o in load_all(out.stdout) if o["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "my-scheduler"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["vpc.amazonaws.com/efa"] == "8"  # trn1.32xlarge's interfaces, matching step 3
        assert pod["spec"]["serviceAccountName"] == "finetune-s3-writer"


def test_cluster_config_matches_the_hardware_facts(files: dict[str, str]) -> None:
    config = yaml.safe_load(files["cluster.yaml"])
    groups = {g["name"]: g for g in config["nodeGroups"]}
    trn = groups["trn1-efa"]
    assert trn["instanceType"] == "trn1.32xlarge" and trn["efaEnabled"] is True
    assert trn["availabilityZones"] == [EXAMPLE_ENV["AZ"]]  # EFA does not cross AZs
    assert trn["placement"]["groupName"]
    assert {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"} in trn["taints"]
    assert "efaEnabled" not in groups["trn1-small"]  # trn1.2xlarge has no EFA
    kubelet = groups["spr"]["kubeletExtraConfig"]
    assert kubelet["cpuManagerPolicy"] == "static"
    assert kubelet["kubeReserved"]["cpu"] != "0" and kubelet["systemReserved"]["cpu"] != "0"
    addons = {a["name"] for a in config["addons"]}
    assert {"aws-efs-csi-driver", "eks-pod-identity-agent"} <= addons


def test_s3_policy_is_json_for_the_bucket(files: dict[str, str]) -> None:
    policy = json.loads(files["s3-policy.json"])
    resources = {r for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str)
                                                          else s["Resource"])}  # fmt: skip
    assert resources == {f"arn:aws:s3:::{EXAMPLE_ENV['BUCKET']}", f"arn:aws:s3:::{EXAMPLE_ENV['BUCKET']}/*"}


def test_cleanup_removes_what_the_guide_creates() -> None:
    text = DOC.read_text()
    cleanup = text.split("## 12. Clean up", 1)[1]
    for created, removed in [
        ("helm install finetune-operator", "helm uninstall finetune-operator"),
        ("aws efs create-file-system", "aws efs delete-file-system"),
        ("aws ec2 create-placement-group", "aws ec2 delete-placement-group"),
        ("aws iam create-policy", "aws iam delete-policy"),
        ("eksctl create podidentityassociation", "eksctl delete podidentityassociation"),
        ("eksctl create cluster", "eksctl delete cluster"),
        ("aws ec2 create-security-group", "aws ec2 delete-security-group"),
        ("create-bucket", "aws s3 rb"),
    ]:
        assert created in text and removed in cleanup, created


def test_results_reader_pod_is_valid(files: dict[str, str], k8s_version: str) -> None:
    """The throw-away pod of step 11 (kubectl run --overrides) is a valid Pod that mounts the results claim."""
    (overrides,) = re.findall(r"--overrides='(\{.*?\})'", DOC.read_text())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "read-results"}, **json.loads(overrides)}
    kubernetes_validate.validate(pod, k8s_version, strict=True)
    claims = {o["metadata"]["name"] for o in load_all(files["claims.yaml"])}
    volumes = pod["spec"]["volumes"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in volumes} <= claims
    sc = load_all(files["efs-sc.yaml"])[0]
    # The EFS access points belong to the images' ftjob user, which is also who reads them here.
    assert sc["parameters"]["uid"] == str(pod["spec"]["securityContext"]["runAsUser"]) == "1000"
