"""`helm lint` and `helm template` of the chart, with assertions on what comes out."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from chartlib import CHART, NAMESPACE, RELEASE, REPO, Manifest, Renderer, Values, find, identities, load_all, one

from finetune_operator import cli, profiles

# The chart's grants, per (apiGroup, resource). That these are exactly the verbs the operator uses is proven by
# tests/controlplane/test_rbac_audit.py from the API server's audit log of real runs; here they are pinned so a
# template change cannot widen them unnoticed.
NAMESPACED_VERBS: dict[tuple[str, str], set[str]] = {
    ("finetune.dev", "finetunejobs"): {"get", "list", "watch", "patch", "delete"},
    ("finetune.dev", "finetunejobs/status"): {"patch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "pods/log"): {"get"},
    ("", "services"): {"get", "list", "watch", "create", "patch"},  # patch: identity labels put back (k8s.relabel)
    ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
    ("", "secrets"): {"get", "create"},  # never list/watch: the operator cannot enumerate Secrets
    ("", "events"): {"create", "patch"},
    # Kueue: the Workload of a queued job (watched by handlers.job_workloads; k8s.Kube.create/relabel/
    # delete_workload/patch_workload_status).
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch", "create", "patch", "delete"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
}
CRD_READ: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    # Kueue: an admitted job's ResourceFlavors (cluster-scoped; k8s.Kube.get_resource_flavor).
    ("kueue.x-k8s.io", "resourceflavors"): {"get"},
    # A queued job's spec.podTemplate.priorityClassName: the Workload's priority (k8s.Kube.get_priority_class).
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
    # Node loss: every Node's Ready condition (watched by handlers.node_health).
    ("", "nodes"): {"list", "watch"},
}
# Leader election: the operator's Lease in its own namespace (leader.Elector: k8s.Kube.get_lease, create_lease,
# update_lease), granted by a Role there in both modes.
LEASE_VERBS: dict[tuple[str, str], set[str]] = {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
LEASE_ROLE = f"{RELEASE}-leader-election"
ELECTION_ARGS = [
    "--leader-elect",
    f"--leader-elect-resource-name={RELEASE}",
    "--leader-elect-lease-duration=15s",
    "--leader-elect-renew-deadline=10s",
    "--leader-elect-retry-period=2s",
]
# kopf 1.45 lists and watches namespaces only when given --namespace flags (namespaced mode); in cluster
# mode it never reads them (kopf/_core/reactor/observation.py: namespace_observer).
NAMESPACES_WATCH: dict[tuple[str, str], set[str]] = {("", "namespaces"): {"list", "watch"}}
# The release version: the chart's appVersion, hence the default operator image's tag (hack/version.py).
VERSION = (REPO / "VERSION").read_text().strip()


def verbs_of(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """Flattens a role's rules; fails on wildcards or resourceNames, which the chart must never use."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def operator_deployment(objs: list[Manifest]) -> Manifest:
    return one(objs, "Deployment", RELEASE, NAMESPACE)


def operator_config(objs: list[Manifest]) -> Any:
    cm = one(objs, "ConfigMap", f"{RELEASE}-config", NAMESPACE)
    return yaml.safe_load(cm["data"]["config.yaml"])


def bound_subjects(binding: Manifest) -> list[tuple[str, str, str]]:
    return [(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]]


def test_helm_lint_default_and_all_features(helm: str, tmp_path: Any) -> None:
    values = tmp_path / "all.yaml"
    values.write_text(
        yaml.safe_dump(
            Values()
            .namespaced("team-a", "team-b")
            .cache_pvc()
            .service_monitor()
            .network_policy()
            .grafana_dashboard()
            .set({"replicaCount": 2})
            .data
        )
    )
    for extra in ([], ["-f", str(values)]):
        out = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout


def test_default_render_has_exactly_the_operator_objects(render: Renderer) -> None:
    objs = render()
    assert identities(objs) == [
        ("ClusterRole", "", "finetune-operator"),
        ("ClusterRole", "", "finetune-operator-cluster"),
        ("ClusterRoleBinding", "", "finetune-operator"),
        ("ClusterRoleBinding", "", "finetune-operator-cluster"),
        ("ConfigMap", NAMESPACE, "finetune-operator-config"),
        ("CustomResourceDefinition", "", "finetunejobs.finetune.dev"),
        ("Deployment", NAMESPACE, "finetune-operator"),
        ("Role", NAMESPACE, LEASE_ROLE),
        ("RoleBinding", NAMESPACE, LEASE_ROLE),
        ("Service", NAMESPACE, "finetune-operator-metrics"),
        ("ServiceAccount", NAMESPACE, "finetune-operator"),
        ("ValidatingAdmissionPolicy", "", "finetunejobs.finetune.dev"),
        ("ValidatingAdmissionPolicyBinding", "", "finetunejobs.finetune.dev"),
    ]


def test_crd_is_a_template_equal_to_the_generated_one_and_kept_on_uninstall(render: Renderer) -> None:
    """The CRD is rendered (so `helm upgrade` applies it) from crd/finetunejobs.yaml, unchanged but for the
    keep annotation: `helm uninstall` leaves it, and with it the users' FineTuneJobs."""
    generated = load_all((CHART / "crd" / "finetunejobs.yaml").read_text())[0]
    crd = one(render(), "CustomResourceDefinition", "finetunejobs.finetune.dev")
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == generated
    # The admission policy comes and goes with the release: nothing of it is kept.
    for policy in (o for o in render() if o["kind"].startswith("ValidatingAdmissionPolicy")):
        assert "helm.sh/resource-policy" not in policy["metadata"].get("annotations", {})


def test_crds_keep_false_lets_uninstall_delete_the_crd(render: Renderer) -> None:
    crd = one(render(Values().set({"crds": {"keep": False}})), "CustomResourceDefinition")
    assert "annotations" not in crd["metadata"]


def test_crds_install_false_leaves_crd_and_policy_out(render: Renderer) -> None:
    kinds = {o["kind"] for o in render(Values().set({"crds": {"install": False}}))}
    assert not kinds & {"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert "Deployment" in kinds


def test_chart_has_no_crds_folder() -> None:
    """Helm installs crds/ once and never upgrades it (nor deletes it): the CRD must stay a template."""
    assert not (CHART / "crds").exists()


def test_deployment_meets_restricted_pod_security(render: Renderer) -> None:
    dep = operator_deployment(render())
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    # Restricted allows only these volume types; a hostPath would break it.
    allowed = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= allowed, volume
    for container in pod["containers"] + pod.get("initContainers", []):
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc.get("privileged", False) is False
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostPort" not in str(container.get("ports"))
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        tmp_volume = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
        assert "emptyDir" in tmp_volume


def test_deployment_runs_one_elected_operator(render: Renderer) -> None:
    dep = operator_deployment(render())
    assert dep["spec"]["replicas"] == 1
    # A new pod starts as a standby; the old one hands the lease over when stopped.
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = dep["spec"]["template"]["spec"]
    assert "affinity" not in pod, "one replica: nothing to spread"
    container = pod["containers"][0]
    assert container["image"] == f"finetune-operator/operator:{VERSION}"
    assert container["command"] == ["ftjob"]
    assert container["args"] == [
        "operator",
        "--config=/etc/finetune-operator/config.yaml",
        "--metrics-port=8080",
        "--health-port=8081",
        *ELECTION_ARGS,
    ]
    # The holder identity is the pod's name, the Lease's namespace the pod's (downward API).
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    config_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/finetune-operator")
    assert config_mount["readOnly"] is True


def test_config_map_names_no_profile_image(render: Renderer) -> None:
    """The profiles hold their image repositories; the chart sets only the registry and the tag, empty by default
    (no registry, the operator's own version)."""
    assert operator_config(render()) == {"images": {"registry": "", "tag": ""}}


@pytest.mark.parametrize(
    ("values", "prefix", "tag"),
    [
        ({}, "", VERSION),
        ({"tag": "2026.12"}, "", "2026.12"),
        (
            {"registry": "123456789012.dkr.ecr.us-west-2.amazonaws.com", "tag": "sdk2.31"},
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/",
            "sdk2.31",
        ),
        ({"registry": "localhost:5000/mirror"}, "localhost:5000/mirror/", VERSION),
    ],
)
def test_operator_composes_the_chart_registry_and_tag_with_each_profile(
    render: Renderer, tmp_path: Any, values: dict[str, str], prefix: str, tag: str
) -> None:
    """What the operator makes of the chart's config (cli.load_config, then the builders) is
    registry/repository:tag for every profile: the image `ftjob render --config` shows."""
    from ftjobs import make_job

    from finetune_operator.admission import validate
    from finetune_operator.builders import desired
    from finetune_operator.cli import load_config

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(operator_config(render(Values().set({"runtimeImages": values})))))
    config = load_config(str(path))
    for profile in profiles.load_all().values():
        job = validate(make_job().profile(profile.name).classification().build())
        pods = desired(job, images=config.get("images")).pods
        assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {
            f"{prefix}{profile.image_repository}:{tag}"
        }


DIGEST = "sha256:" + "5e" * 32


def test_operator_image_by_digest_when_set_else_by_tag(render: Renderer) -> None:
    """A released chart names the operator image by digest (no push can change it); by hand, by tag."""
    image = {"repository": "registry.example:5000/ft/finetune-operator/operator", "tag": "ignored", "digest": DIGEST}
    container = operator_deployment(render(Values().set({"operator": {"image": image}})))["spec"]["template"]
    assert (
        container["spec"]["containers"][0]["image"] == f"registry.example:5000/ft/finetune-operator/operator@{DIGEST}"
    )
    by_tag = operator_deployment(render(Values().set({"operator": {"image": {"tag": "handbuilt"}}})))
    assert by_tag["spec"]["template"]["spec"]["containers"][0]["image"] == "finetune-operator/operator:handbuilt"


def test_runtime_digests_pin_their_profiles_images_and_the_rest_keep_the_tag(render: Renderer, tmp_path: Any) -> None:
    """runtimeImages.digests (a released chart's) reaches the operator's config, and the operator runs each
    pinned repository by digest: the image `ftjob render --config` shows."""
    from ftjobs import make_job

    from finetune_operator.admission import validate
    from finetune_operator.builders import desired
    from finetune_operator.cli import load_config

    runtime = {"registry": "registry.example:5000/ft", "tag": "9.9.9", "digests": {"finetune-operator/cpu": DIGEST}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(operator_config(render(Values().set({"runtimeImages": runtime})))))
    config = load_config(str(path))
    for profile in profiles.load_all().values():
        job = validate(make_job().profile(profile.name).classification().build())
        pods = desired(job, images=config.get("images")).pods
        expected = f"registry.example:5000/ft/{profile.image_repository}" + (
            f"@{DIGEST}" if profile.image_repository == "finetune-operator/cpu" else ":9.9.9"
        )
        assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {expected}, profile.name


def test_config_change_rolls_the_operator_pod(render: Renderer) -> None:
    def checksum(objs: list[Manifest]) -> str:
        return str(operator_deployment(objs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    before = checksum(render())
    after = checksum(render(Values().set({"runtimeImages": {"tag": "1"}})))
    assert before != after


def test_two_replicas_get_a_disruption_budget_and_spread_over_nodes(render: Renderer) -> None:
    objs = render(Values().set({"replicaCount": 2}))
    dep = operator_deployment(objs)
    assert dep["spec"]["replicas"] == 2
    selector = dep["spec"]["selector"]["matchLabels"]
    pdb = one(objs, "PodDisruptionBudget", RELEASE, NAMESPACE)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": selector},
    }
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": selector},
                },
            }
        ]
    }
    assert find(render(), "PodDisruptionBudget") == [], "one replica: a budget would block every drain"


def test_a_given_affinity_is_kept_and_gains_the_spread_unless_it_has_its_own(render: Renderer) -> None:
    node = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": []}]}}
    affinity = operator_deployment(
        render(Values().set({"replicaCount": 2, "operator": {"affinity": {"nodeAffinity": node}}}))
    )["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node and "podAntiAffinity" in affinity
    own = {"requiredDuringSchedulingIgnoredDuringExecution": []}
    affinity = operator_deployment(
        render(Values().set({"replicaCount": 2, "operator": {"affinity": {"podAntiAffinity": own}}}))
    )["spec"]["template"]["spec"]["affinity"]
    assert affinity == {"podAntiAffinity": own}


def test_election_timings_reach_the_flags(render: Renderer) -> None:
    timings = {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 2.5}
    container = operator_deployment(render(Values().set({"leaderElection": timings})))["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][-3:] == [
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=2.5s",
    ]
    assert cli.build_parser().parse_args(container["args"]).leader_elect_retry_period == 2.5


def test_election_disabled_runs_one_operator_recreated_without_a_lease_role(render: Renderer) -> None:
    objs = render(Values().set({"leaderElection": {"enabled": False}}))
    dep = operator_deployment(objs)
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--leader-elect")] and "env" not in container
    assert find(objs, "Role") == [] and find(objs, "RoleBinding") == []


def test_cluster_mode_rbac_grants_exactly_the_operator_verbs(render: Renderer) -> None:
    objs = render()
    role = one(objs, "Role", LEASE_ROLE, NAMESPACE)
    assert verbs_of(role) == LEASE_VERBS
    binding = one(objs, "RoleBinding", LEASE_ROLE, NAMESPACE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEASE_ROLE}
    assert bound_subjects(binding) == [("ServiceAccount", "finetune-operator", NAMESPACE)]
    assert [r["metadata"]["name"] for r in find(objs, "Role")] == [LEASE_ROLE]
    assert verbs_of(one(objs, "ClusterRole", "finetune-operator")) == NAMESPACED_VERBS
    assert verbs_of(one(objs, "ClusterRole", "finetune-operator-cluster")) == CRD_READ
    for name in ("finetune-operator", "finetune-operator-cluster"):
        binding = one(objs, "ClusterRoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        }
        assert bound_subjects(binding) == [("ServiceAccount", "finetune-operator", NAMESPACE)]


def test_namespaced_mode_has_a_role_per_namespace_and_only_reads_cluster_wide(render: Renderer) -> None:
    objs = render(Values().namespaced("team-a", "team-b"), namespace="ops")
    cluster_roles = find(objs, "ClusterRole")
    assert [r["metadata"]["name"] for r in cluster_roles] == ["finetune-operator-cluster"]
    assert verbs_of(cluster_roles[0]) == CRD_READ | NAMESPACES_WATCH
    assert [b["metadata"]["name"] for b in find(objs, "ClusterRoleBinding")] == ["finetune-operator-cluster"]
    for ns in ("team-a", "team-b"):
        assert verbs_of(one(objs, "Role", "finetune-operator", ns)) == NAMESPACED_VERBS
        binding = one(objs, "RoleBinding", "finetune-operator", ns)
        assert binding["roleRef"]["kind"] == "Role"
        # The service account lives in the release namespace, not in the watched one.
        assert bound_subjects(binding) == [("ServiceAccount", "finetune-operator", "ops")]
    # The Lease's Role is the one Role in the release namespace, in this mode too.
    assert {r["metadata"]["namespace"] for r in find(objs, "Role")} == {"team-a", "team-b", "ops"}
    assert verbs_of(one(objs, "Role", LEASE_ROLE, "ops")) == LEASE_VERBS
    args = one(objs, "Deployment", "finetune-operator", "ops")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--namespace=team-a", "--namespace=team-b"]


def test_rbac_create_false_renders_no_roles(render: Renderer) -> None:
    objs = render(Values().set({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops"}}))
    assert not [o for o in objs if o["kind"].endswith(("Role", "RoleBinding"))]
    assert find(objs, "ServiceAccount") == []
    assert operator_deployment(objs)["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        (Values().cache_pvc(), [NAMESPACE]),
        (Values().cache_pvc().namespaced("team-a", "team-b"), ["team-a", "team-b"]),
        (Values().cache_pvc(namespaces=["ml"]).namespaced("team-a"), ["ml"]),
    ],
)
def test_cache_pvc_is_rwx_in_each_job_namespace(render: Renderer, values: Values, namespaces: list[str]) -> None:
    claims = find(render(values), "PersistentVolumeClaim")
    assert sorted(c["metadata"]["namespace"] for c in claims) == namespaces
    for claim in claims:
        assert claim["metadata"]["name"] == "finetune-cache"
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert claim["spec"]["storageClassName"] == "efs-sc"
        assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
        assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_cache_pvc_storage_class_size_and_keep(render: Renderer) -> None:
    values = Values().cache_pvc(storageClassName="fsx-sc", size="1200Gi", keepOnUninstall=False, name="neuron")
    claim = one(render(values), "PersistentVolumeClaim", "neuron", NAMESPACE)
    assert claim["spec"]["storageClassName"] == "fsx-sc"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1200Gi"
    assert "annotations" not in claim["metadata"]


def test_service_monitor_selects_the_metrics_service(render: Renderer) -> None:
    objs = render(Values().service_monitor(interval="15s", labels={"release": "kube-prometheus-stack"}))
    monitor = one(objs, "ServiceMonitor", "finetune-operator", NAMESPACE)
    service = one(objs, "Service", "finetune-operator-metrics", NAMESPACE)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "15s", "scrapeTimeout": "10s"}
    ]
    assert service["spec"]["ports"][0] == {
        "name": "metrics",
        "port": 8080,
        "targetPort": "metrics",
        "protocol": "TCP",
    }
    # The Service reaches the operator pod.
    pod_labels = operator_deployment(objs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_service_monitor_without_service_is_refused(render: Renderer) -> None:
    result = render.run(Values().service_monitor().set({"metrics": {"service": {"enabled": False}}}))
    assert result.returncode != 0
    assert "metrics.service.enabled" in result.stderr


def test_network_policy_is_made_per_job_by_the_operator(render: Renderer) -> None:
    """Policies are additive, so a chart-wide "same operator" rule would let jobs reach each other: the chart
    only switches the operator's per-job policies on and grants it the verbs for them."""
    extra = {
        "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        "ports": [{"port": 9100}],
    }
    objs = render(Values().network_policy(extraIngress=[extra]).namespaced("team-a", "team-b"))
    assert find(objs, "NetworkPolicy") == []
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    assert config["networkPolicy"] == {"enabled": True, "extraIngress": [extra]}
    for role in find(objs, "Role", RELEASE):  # the per-namespace ones (not the Lease's)
        rule = [r for r in role["rules"] if r["apiGroups"] == ["networking.k8s.io"]]
        assert rule == [
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch", "create", "patch"],
            }
        ]


def test_network_policy_off_grants_nothing_for_it(render: Renderer) -> None:
    objs = render(Values())
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    assert "networkPolicy" not in config
    for role in find(objs, "ClusterRole"):
        assert all(r["apiGroups"] != ["networking.k8s.io"] for r in role["rules"])


def test_allowlists_reach_the_operator_config_and_load_there(render: Renderer, tmp_path: Any) -> None:
    """What the chart writes is what `ftjob operator --config` accepts (cli.load_config refuses a bad policy)."""
    from finetune_operator.cli import load_config

    assert "policy" not in operator_config(render(Values()))  # empty lists: no policy block at all
    policy = {
        "allowedImages": ["registry.example.com/team/*"],
        "allowedServiceAccounts": ["trainer"],
        "allowedSecrets": [],
        "allowedClaims": [
            {"namespaces": ["team-a"], "claims": ["team-a-results"], "purposes": ["output"]},
            {"claims": ["finetune-cache"], "purposes": ["compileCache"]},
            {"claims": ["fsx-*"], "purposes": ["volume"]},
        ],
        "allowedTolerationKeys": ["nvidia.com/gpu"],
        "allowedNodeLabels": ["pool=team-a-*"],
        "allowedSchedulerNames": ["neuron-scheduler"],
        "queueRequiredNamespaces": ["team-*"],
        "allowedVolumeTypes": ["persistentVolumeClaim", "emptyDir"],
        "allowedSidecarImages": ["registry.example.com/sidecars/*"],
        "allowedPriorityClasses": ["training-*"],
    }
    config = operator_config(render(Values().set({"policy": policy})))
    written = {k: v for k, v in policy.items() if v}  # an empty list allows everything, as an absent one
    assert config["policy"] == written
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert load_config(str(path))["policy"] == written


def test_every_policy_key_of_the_chart_is_one_the_operator_knows() -> None:
    """values.yaml, values.schema.json and policy.py name the same keys."""
    import json

    from chartlib import CHART

    from finetune_operator.policy import KEYS

    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["policy"]["properties"]
    assert list(values) == list(schema) == list(KEYS)


def test_non_default_operator_settings(render: Renderer) -> None:
    objs = render(
        Values().set(
            {
                "fullnameOverride": "ftop",
                "operator": {
                    "image": {
                        "repository": "registry.example:5000/ft/operator",
                        "tag": "dev",
                        "pullPolicy": "Always",
                    },
                    "imagePullSecrets": [{"name": "regcred"}],
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "runAsUser": 2000,
                },
                "metrics": {"port": 9090},
                "health": {"port": 9091},
            }
        )
    )
    dep = one(objs, "Deployment", "ftop", NAMESPACE)
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example:5000/ft/operator:dev"
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["securityContext"]["runAsUser"] == 2000
    assert "--metrics-port=9090" in container["args"] and "--health-port=9091" in container["args"]
    assert one(objs, "Service", "ftop-metrics")["spec"]["ports"][0]["port"] == 9090
    assert pod["volumes"][0]["configMap"]["name"] == "ftop-config"
    one(objs, "ConfigMap", "ftop-config", NAMESPACE)


def test_notes_name_the_mode_and_the_namespaces(helm: str) -> None:
    out = subprocess.run(
        [
            helm,
            "install",
            "--dry-run=client",
            RELEASE,
            str(CHART),
            "-n",
            "ops",
            "--set",
            "watchNamespaces={team-a,team-b}",
            "--set",
            "cachePVC.create=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "Mode: namespaced. FineTuneJobs are handled only in: team-a, team-b." in notes
    assert "kubectl -n ops rollout status deployment/finetune-operator" in notes
    assert 'Compile cache claim "finetune-cache" (efs-sc, 200Gi) in: team-a, team-b.' in notes
    assert (
        "Default runtime images (a job may name its own): <the profile's imageRepository>:<the operator's version>"
        in notes
    )
