"""docs/eks.md stays copyable: every file it writes is valid for whoever reads it, and it only uses what it defines.

No AWS account here, so eksctl/aws commands are not run. What can be checked offline: every YAML and JSON block
parses; each object in them validates against the schema of its reader (the eksctl ClusterConfig against
eksctl's own JSON schema, vendored in schemas/; Kubernetes objects against the pinned OpenAPI schema;
FineTuneJobs through the operator's own validation, `ftjob render`; the Helm values by rendering the chart);
the pods the guide's jobs create fit the node groups it builds (EFA, hugepages, taints); and every shell
variable is set before use.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartlib import CHART, RELEASE, REPO, Manifest, find, load_all, one

DOC = REPO / "docs" / "eks.md"
# eksctl's ClusterConfig schema of the minimum release docs/eks.md names and of a recent one (schemas/README.md):
# the guide's ClusterConfig must be valid for both.
EKSCTL_MINIMUM = "0.202.0"
EKSCTL_SCHEMAS = {
    version: Path(__file__).with_name("schemas") / f"eksctl-v{version}.schema.json"
    for version in (EKSCTL_MINIMUM, "0.230.0")
}
CRD = CHART / "crd" / "finetunejobs.yaml"
# Example values for the variables the guide sets from AWS answers (account id, file system id, ...).
EXAMPLE_ENV = {
    "CLUSTER": "finetune",
    "REGION": "us-west-2",
    "EKS_VERSION": "1.34",
    "ACCOUNT_ID": "123456789012",
    "ECR": "123456789012.dkr.ecr.us-west-2.amazonaws.com",
    "TAG": (REPO / "VERSION").read_text().strip(),
    "BUCKET": "finetune-results-123456789012",
    "JOBS_NS": "ml",
    "AZ": "us-west-2d",
    "AZ2": "us-west-2a",
    "EFS_ID": "fs-0123456789abcdef0",
}
HEREDOC = re.compile(r"^cat > (?P<name>\S+) <<(?P<quote>'?)EOF\n(?P<body>.*?)^EOF$", re.M | re.S)
# What bash does to an unquoted heredoc body: \$ \` \\ lose the backslash, \<newline> joins lines, $VAR and
# ${VAR} expand. $( and ` would run a command on the reader's machine while writing the file.
UNQUOTED_HEREDOC_TOKEN = re.compile(r"\\([$`\\])|\\\n|\$\{(\w+)\}|\$(\w+)|(\$\(|`)")
FENCED = re.compile(r"^```(?P<lang>yaml|json)\n(?P<body>.*?)^```$", re.M | re.S)
# The strategic-merge patch of step 3 that lets eksctl's EFA device plugin onto tainted nodes.
EFA_PATCH = re.compile(r"patch daemonset aws-efa-k8s-device-plugin --type strategic -p '(?P<patch>.*?)'", re.S)


def bash_blocks(text: str | None = None) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", DOC.read_text() if text is None else text, re.M | re.S)


def expand_heredoc(body: str) -> str:
    def token(m: re.Match[str]) -> str:
        if m[4]:
            raise AssertionError(f"unescaped {m[4]!r} in an unquoted heredoc runs while the file is written")
        if m[1]:
            return m[1]
        if m[0] == "\\\n":
            return ""
        return EXAMPLE_ENV[m[2] or m[3]]

    return UNQUOTED_HEREDOC_TOKEN.sub(token, body)


def heredocs(text: str | None = None) -> dict[str, str]:
    """name -> body as bash writes it (unquoted EOF: expanded with EXAMPLE_ENV)."""
    out = {}
    for block in bash_blocks(text):
        for m in HEREDOC.finditer(block):
            out[m["name"]] = m["body"] if m["quote"] else expand_heredoc(m["body"])
    return out


def data_blocks(text: str) -> dict[str, tuple[str, str]]:
    """Every YAML/JSON block of the guide: heredoc files by name, fenced blocks as `fenced-N`; -> (lang, body)."""
    out: dict[str, tuple[str, str]] = {}
    for name, body in heredocs(text).items():
        if name.endswith((".yaml", ".yml", ".json")):
            out[name] = ("json" if name.endswith(".json") else "yaml", body)
    for n, m in enumerate(FENCED.finditer(text)):
        out[f"fenced-{n}"] = (m["lang"], m["body"])
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    found = heredocs()
    expected = {
        "cluster.yaml",
        "efs-sc.yaml",
        "claims.yaml",
        "s3-policy.json",
        "values-eks.yaml",
        "bert-ja-trn1-2x32.yaml",
    }
    assert expected <= set(found), f"docs/eks.md no longer writes {expected - set(found)}"
    return found


@pytest.fixture(scope="module")
def cluster_config(files: dict[str, str]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(files["cluster.yaml"])
    return config


def node_groups(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [*config.get("managedNodeGroups", []), *config.get("nodeGroups", [])]


# --- every block parses, and every object validates against its reader's schema --------------------------


def eksctl_errors(obj: Manifest, versions: tuple[str, ...] = tuple(EKSCTL_SCHEMAS)) -> list[str]:
    """Errors of a ClusterConfig under the schema of each eksctl release in `versions`."""
    errors = []
    for version in versions:
        validator = jsonschema.Draft7Validator(json.loads(EKSCTL_SCHEMAS[version].read_text()))
        errors += [
            f"eksctl {version}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
    return errors


def finetunejob_errors(obj: Manifest) -> list[str]:
    ftjob = Path(sys.executable).with_name("ftjob")
    out = subprocess.run(
        [str(ftjob), "render", "-f", "-", "-n", "ml"],
        input=yaml.safe_dump(obj),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return [] if out.returncode == 0 else [out.stderr.strip()]


def validate_object(obj: Manifest, k8s_version: str) -> list[str]:
    """Errors of one object from the schema of whatever reads it; raises for an object nothing would check."""
    api = obj.get("apiVersion", "")
    if api.startswith("eksctl.io/"):
        return eksctl_errors(obj)
    if api.startswith("finetune.dev/"):
        return finetunejob_errors(obj)
    if api:
        try:
            kubernetes_validate.validate(obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            return [f"{'.'.join(map(str, err.path))}: {err.message}"]
        return []
    raise AssertionError(f"no schema known for {obj!r:.80}")


# Blocks that are not Kubernetes-style objects, and the test that checks each.
CHECKED_ELSEWHERE = {
    "values-eks.yaml": "test_values_file_renders_the_chart_in_namespaced_mode",
    "s3-policy.json": "test_s3_policy_is_json_for_the_bucket",
}


def block_errors(name: str, lang: str, body: str, k8s_version: str) -> list[str]:
    try:
        docs = [json.loads(body)] if lang == "json" else load_all(body)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        return [f"does not parse: {err}"]
    if not docs:
        return ["is empty"]
    if name in CHECKED_ELSEWHERE:
        return []
    return [f"{doc.get('kind', '?')}: {e}" for doc in docs for e in validate_object(doc, k8s_version)]


def dataset_files_supported() -> bool:
    """Whether this checkout's CRD has spec.task.dataset.dataFiles (the guide's job reads the Hub's files)."""
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return "dataFiles" in spec["properties"]["task"]["properties"]["dataset"]["properties"]


# The guide's own job already reads the Hub's data files; the CRD field that takes them lands separately.
# strict: until then its checks must fail (unknown field), and from then on they must pass.
UNTIL_DATA_FILES = pytest.mark.xfail(
    not dataset_files_supported(), strict=True, reason="the CRD has no spec.task.dataset.dataFiles yet"
)


def block_params() -> list[Any]:
    return [
        pytest.param(name, marks=[UNTIL_DATA_FILES] if name == "bert-ja-trn1-2x32.yaml" else [], id=name)
        for name in data_blocks(DOC.read_text())
    ]


@pytest.mark.parametrize("name", block_params())
def test_every_data_block_is_valid_for_its_reader(name: str, k8s_version: str) -> None:
    lang, body = data_blocks(DOC.read_text())[name]
    assert not block_errors(name, lang, body, k8s_version), f"docs/eks.md {name}"


def test_a_broken_block_is_caught(k8s_version: str) -> None:
    """The checks above can fail: a misspelt eksctl field, a wrong Kubernetes field and bad YAML are reported."""
    blocks = data_blocks(DOC.read_text())
    _, cluster = blocks["cluster.yaml"]
    assert block_errors("cluster.yaml", "yaml", cluster.replace("efaEnabled:", "efaEnable:"), k8s_version)
    _, claims = blocks["claims.yaml"]
    assert block_errors("claims.yaml", "yaml", claims.replace("accessModes:", "accessMode:"), k8s_version)
    assert block_errors("efs-sc.yaml", "yaml", "kind: [", k8s_version)
    with pytest.raises(AssertionError, match="unescaped"):
        expand_heredoc('test "$(sysctl -n vm.nr_hugepages)" -ge 1\n')


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
            if read := re.match(r"\s*read\b.*\s([A-Z][A-Z0-9_]*)\s*(?:&&.*)?$", line):
                defined.add(read.group(1))  # read [-options] NAME
            for used in re.findall(r"(?<!\\)\$\{?([A-Za-z_]\w*)", line):
                if used in {"IMAGE_TAG"}:  # set inline for build.sh on the same line
                    continue
                assert used in defined, f"${used} is used before it is set in: {line.strip()}"


# --- the eksctl ClusterConfig ------------------------------------------------------------------------------


def test_the_minimum_eksctl_is_the_one_step_0_names_and_its_schema_is_applied(cluster_config: dict[str, Any]) -> None:
    """Step 0 names the release whose schema is pinned, and that older schema really is in force: a field that
    only later releases know (instanceMarketOptions, 0.205.0) is refused by it and accepted by the newer one."""
    text = DOC.read_text()
    assert f"`eksctl` {EKSCTL_MINIMUM} or newer" in text
    newer = copy.deepcopy(cluster_config)
    newer["nodeGroups"][0]["instanceMarketOptions"] = {"marketType": "capacity-block"}
    assert eksctl_errors(newer, ("0.230.0",)) == []
    (error,) = eksctl_errors(newer, (EKSCTL_MINIMUM,))
    assert error.startswith(f"eksctl {EKSCTL_MINIMUM}: nodeGroups.0:") and "instanceMarketOptions" in error


def test_cluster_config_matches_the_hardware_facts(cluster_config: dict[str, Any]) -> None:
    groups = {g["name"]: g for g in node_groups(cluster_config)}
    trn = groups["trn1-efa"]
    assert trn["instanceType"] == "trn1.32xlarge" and trn["efaEnabled"] is True
    assert trn["availabilityZones"] == [EXAMPLE_ENV["AZ"]]  # EFA does not cross AZs
    # eksctl makes the cluster placement group of an EFA group itself; a named one needs creating beforehand.
    assert "placement" not in trn and "aws ec2 create-placement-group --region" not in DOC.read_text()
    assert {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"} in trn["taints"]
    assert "efaEnabled" not in groups["trn1-small"]  # trn1.2xlarge has no EFA
    kubelet = groups["spr"]["kubeletExtraConfig"]
    assert kubelet["cpuManagerPolicy"] == "static"
    assert kubelet["kubeReserved"]["cpu"] != "0" and kubelet["systemReserved"]["cpu"] != "0"
    # kubeletExtraConfig exists only on self-managed groups: in a managed one eksctl's schema rejects it.
    assert "spr" in {g["name"] for g in cluster_config["nodeGroups"]}
    addons = {a["name"]: a for a in cluster_config["addons"]}
    assert {"aws-efs-csi-driver", "eks-pod-identity-agent"} <= set(addons)


def test_vpc_cni_runs_the_network_policy_agent(cluster_config: dict[str, Any], files: dict[str, str]) -> None:
    """networkPolicy.enabled in the chart values needs an engine: the VPC CNI's agent, switched on here."""
    assert yaml.safe_load(files["values-eks.yaml"])["networkPolicy"]["enabled"] is True
    (cni,) = [a for a in cluster_config["addons"] if a["name"] == "vpc-cni"]
    # eksctl passes configurationValues to EKS as a JSON string; the add-on wants the string "true".
    assert json.loads(cni["configurationValues"])["enableNetworkPolicy"] == "true"


def test_quotas_cover_what_the_cluster_starts(cluster_config: dict[str, Any]) -> None:
    """Step 0's quota numbers are the vCPUs of step 1's desired capacity (Trn: trn*, Standard: the m7i)."""
    vcpus = {"trn1.32xlarge": 128, "trn1.2xlarge": 8, "m7i.metal-48xl": 192, "m7i.xlarge": 4}
    need = {"Trn": 0, "Standard": 0}
    for group in node_groups(cluster_config):
        family = "Trn" if group["instanceType"].startswith("trn") else "Standard"
        need[family] += vcpus[group["instanceType"]] * group["desiredCapacity"]
    text = DOC.read_text()
    assert f"**{need['Trn']} Trn vCPUs**" in text and f"**{need['Standard']} Standard vCPUs**" in text
    for code, family in [("L-2C3B7624", "Trn"), ("L-1216C47A", "Standard")]:
        assert f"--quota-code {code} --desired-value {need[family]}" in text


# --- the pods of the guide's jobs fit the node groups --------------------------------------------------


def toleration_matches(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule: same key (or an empty key with Exists), same effect (or none), value if Equal."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


def efa_plugin_patch() -> dict[str, Any]:
    (patch,) = EFA_PATCH.findall(DOC.read_text())
    result: dict[str, Any] = json.loads(patch)
    return result


def test_efa_plugin_patch_is_a_valid_daemonset_that_reaches_every_efa_group(
    cluster_config: dict[str, Any], k8s_version: str
) -> None:
    """eksctl's EFA plugin tolerates only CriticalAddonsOnly and aws.amazon.com/efa; the patch of step 3 must keep
    those and tolerate every taint of every efaEnabled group, or those nodes never advertise their EFA."""
    patch = efa_plugin_patch()
    tolerations = patch["spec"]["template"]["spec"]["tolerations"]
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "aws-efa-k8s-device-plugin", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "aws-efa-k8s-device-plugin"}},
            "template": {
                "metadata": {"labels": {"name": "aws-efa-k8s-device-plugin"}},
                "spec": {"containers": [{"name": "plugin", "image": "plugin"}], "tolerations": tolerations},
            },
        },
    }
    kubernetes_validate.validate(daemonset, k8s_version, strict=True)
    keys = {t["key"] for t in tolerations}
    assert {"CriticalAddonsOnly", "aws.amazon.com/efa"} <= keys  # eksctl's own, which the list replaces
    efa_groups = [g for g in node_groups(cluster_config) if g.get("efaEnabled")]
    assert {g["name"] for g in efa_groups} == {"trn1-efa", "spr"}
    for group in efa_groups:
        for taint in group.get("taints", []):
            assert any(toleration_matches(t, taint) for t in tolerations), (group["name"], taint)


def quantity_mib(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", value).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def reserved_hugepages_mib(group: dict[str, Any]) -> int:
    """2 MiB pages the group's preBootstrapCommands make sure of before the kubelet starts."""
    pages = [
        int(n) for cmd in group.get("preBootstrapCommands", []) for n in re.findall(r"vm\.nr_hugepages=(\d+)", cmd)
    ]
    return 2 * max(pages, default=0)


def render_pods(job_yaml: str) -> list[Manifest]:
    ftjob = Path(sys.executable).with_name("ftjob")
    out = subprocess.run(
        [str(ftjob), "render", "-f", "-", "-n", "ml"], input=job_yaml, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [o for o in load_all(out.stdout) if o["kind"] == "Pod"]


def job_params() -> list[Any]:
    applied = re.findall(r"apply -f (manifests/samples/\S+\.yaml)", DOC.read_text())
    params = [pytest.param(path, id=path) for path in applied]
    params.append(pytest.param("bert-ja-trn1-2x32.yaml", marks=[UNTIL_DATA_FILES], id="bert-ja-trn1-2x32.yaml"))
    return params


@pytest.mark.parametrize("job", job_params())
def test_job_pods_fit_the_node_groups(job: str, files: dict[str, str], cluster_config: dict[str, Any]) -> None:
    """Each rank pod lands on a group of its instance type that tolerates nothing it lacks: the group has EFA
    when the pod asks for EFA, reserves the hugepages the pod asks for, and the pod tolerates its taints."""
    text = files[job] if job in files else (REPO / job).read_text()
    groups = node_groups(cluster_config)
    checked = 0
    for pod in render_pods(text):
        instance_type = pod["spec"].get("nodeSelector", {}).get("node.kubernetes.io/instance-type")
        if instance_type is None:  # the MPI launcher: any node
            continue
        (group,) = [g for g in groups if g["instanceType"] == instance_type]
        limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
        if "vpc.amazonaws.com/efa" in limits:
            assert group.get("efaEnabled") is True, f"{pod['metadata']['name']} asks for EFA; {group['name']} has none"
        if "hugepages-2Mi" in limits:
            assert reserved_hugepages_mib(group) >= quantity_mib(limits["hugepages-2Mi"]), group["name"]
        for taint in group.get("taints", []):
            assert any(toleration_matches(t, taint) for t in pod["spec"].get("tolerations", [])), (group["name"], taint)
        checked += 1
    assert checked


@UNTIL_DATA_FILES
def test_finetunejob_runs_two_trn1_nodes_with_all_their_efa(files: dict[str, str]) -> None:
    pods = render_pods(files["bert-ja-trn1-2x32.yaml"])
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "my-scheduler"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["vpc.amazonaws.com/efa"] == "8"  # trn1.32xlarge's interfaces, matching step 3
        assert pod["spec"]["serviceAccountName"] == "finetune-s3-writer"


def test_finetunejob_reads_the_hubs_files_with_the_seeds_recipe(files: dict[str, str]) -> None:
    """amazon_reviews_multi is gone from the Hub; mteb's copy has label = stars - 1: 1-2 stars negative, 4-5
    positive, 3 dropped."""
    dataset = yaml.safe_load(files["bert-ja-trn1-2x32.yaml"])["spec"]["task"]["dataset"]
    assert "name" not in dataset and "config" not in dataset
    for split, url in dataset["dataFiles"].items():
        assert url == f"hf://datasets/mteb/amazon_reviews_multi/ja/{split}.jsonl"
    assert dataset["labelMap"] == {"0": 0, "1": 0, "3": 1, "4": 1}
    assert (dataset["textColumn"], dataset["labelColumn"]) == ("text", "label")


# --- the other files --------------------------------------------------------------------------------------


def test_values_file_renders_the_chart_in_namespaced_mode(files: dict[str, str], helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values-eks.yaml"
    values.write_text(files["values-eks.yaml"])
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "-n", "finetune-operator", "-f", str(values)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    objs = load_all(out.stdout)
    ecr = EXAMPLE_ENV["ECR"]
    container = one(objs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{ecr}/finetune-operator/operator:{EXAMPLE_ENV['TAG']}"
    assert "--namespace=ml" in container["args"]
    assert "--leader-elect" in container["args"]
    assert one(objs, "Deployment", RELEASE)["spec"]["replicas"] == 2
    one(objs, "PodDisruptionBudget", RELEASE)  # the guide's two system nodes: one operator pod evicted at a time
    assert [r["metadata"]["namespace"] for r in find(objs, "Role", RELEASE)] == ["ml"]  # + the Lease's, in its own
    config = yaml.safe_load(one(objs, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
    assert config["images"] == {"registry": ecr, "tag": EXAMPLE_ENV["TAG"]}
    claim = one(objs, "PersistentVolumeClaim", "finetune-cache", "ml")
    assert claim["spec"]["storageClassName"] == "efs-sc"
    assert config["networkPolicy"]["enabled"] is True
    # kube-prometheus-stack (release kube-prometheus-stack) scrapes ServiceMonitors with its release label, and its
    # Grafana sidecar loads ConfigMaps labelled grafana_dashboard=1 from every namespace.
    installed = re.search(r"helm upgrade --install (\S+) prometheus-community/kube-prometheus-stack", DOC.read_text())
    assert installed
    monitor = one(objs, "ServiceMonitor", RELEASE)
    assert monitor["metadata"]["labels"]["release"] == installed.group(1)
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert one(objs, "ConfigMap", f"{RELEASE}-dashboard")["metadata"]["labels"]["grafana_dashboard"] == "1"


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
    jobs: list[tuple[str, Callable[[], str]]] = [(p, (REPO / p).read_text) for p in applied]
    jobs.append(("bert-ja-trn1-2x32.yaml", lambda: files["bert-ja-trn1-2x32.yaml"]))
    for path, read in jobs:
        job: dict[str, Any] = yaml.safe_load(read())
        for block in ("compileCache", "output"):
            claim_name = job["spec"].get(block, {}).get("claimName")
            assert claim_name is None or claim_name in created, f"{path}: claim {claim_name} is never created"


def test_s3_policy_is_json_for_the_bucket(files: dict[str, str]) -> None:
    policy = json.loads(files["s3-policy.json"])
    resources = {
        r for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
    }
    assert resources == {f"arn:aws:s3:::{EXAMPLE_ENV['BUCKET']}", f"arn:aws:s3:::{EXAMPLE_ENV['BUCKET']}/*"}


def test_cleanup_removes_what_the_guide_creates() -> None:
    text = DOC.read_text()
    cleanup = text.split("## 12. Clean up", 1)[1]
    for created, removed in [
        ("helm install finetune-operator", "helm uninstall finetune-operator"),
        ("aws efs create-file-system", "aws efs delete-file-system"),
        ("aws iam create-policy", "aws iam delete-policy"),
        ("eksctl create podidentityassociation", "eksctl delete podidentityassociation"),
        ("eksctl create cluster", "eksctl delete cluster"),  # with it the node groups' placement groups
        ("aws ec2 create-security-group", "aws ec2 delete-security-group"),
        ("create-bucket", "aws s3 rb"),
        ("aws ec2 create-vpc-endpoint", "aws ec2 delete-vpc-endpoints"),
        ('--group-name "${CLUSTER}-endpoints"', '--group-id "$ENDPOINT_SG"'),
        ("helm upgrade --install kube-prometheus-stack", "helm uninstall kube-prometheus-stack"),
        ("create secret generic hf-token", "delete secret hf-token"),
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
