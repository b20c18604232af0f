"""Builders: golden objects for every sample, and each derivation rule on its own."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from ftjobs import SAMPLES, load_sample, make_job

from finetune_operator import __version__
from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys, desired
from finetune_operator.cli import dump_yaml_stream
from finetune_operator.constants import LABEL_ROLE

GOLDEN = Path(__file__).parent / "golden"
KEYS = SshKeys("PRIVATE KEY\n", "ssh-ed25519 AAAA user\n", "HOST PRIVATE KEY\n", "ssh-ed25519 BBBB host\n")


def render(job: dict[str, Any], **kw: Any) -> Any:
    return desired(validate(job), ssh_keys=KEYS, **kw)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in container["env"]}


def pod(children: Any, name: str) -> dict[str, Any]:
    return next(p for p in children.pods if p["metadata"]["name"] == name)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_golden(sample: Path) -> None:
    """Set UPDATE_GOLDEN=1 to rewrite; review the diff like code."""
    out = dump_yaml_stream(render(yaml.safe_load(sample.read_text())).all())
    golden = GOLDEN / f"{sample.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no golden for {sample.stem}: run with UPDATE_GOLDEN=1"
    assert out == golden.read_text()


def test_trn1_one_core_requests_a_neuroncore() -> None:
    c = render(load_sample("trn1-bert-ja-1core-fp32"))
    res = c.pods[0]["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"aws.amazon.com/neuroncore": "1"}
    assert res["requests"]["aws.amazon.com/neuroncore"] == "1"
    assert res["requests"]["cpu"] == "2"  # (8 vCPU - 4 reserved) * 1/2 cores
    assert c.layout.world_size == 1
    env = env_of(c.pods[0]["spec"]["containers"][0])
    assert env["NEURON_COMPILE_CACHE_URL"] == "/cache/neuron"
    assert "NEURON_RT_STOCHASTIC_ROUNDING_EN" not in env  # fp32
    assert "NEURON_RT_ROOT_COMM_ID" not in env  # single node
    assert "FI_PROVIDER" not in env and "vpc.amazonaws.com/efa" not in res["limits"]


def test_trn1_two_cores_request_one_device_and_bf16_rounding() -> None:
    c = render(load_sample("trn1-bert-ja-2core-bf16"))
    trainer = c.pods[0]["spec"]["containers"][0]
    assert trainer["resources"]["limits"] == {"aws.amazon.com/neuron": "1"}
    assert env_of(trainer)["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1"
    assert env_of(trainer)["FTJOB_NPROC_PER_NODE"] == "2"
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in c.pods[0]["spec"][
        "tolerations"
    ]
    assert c.pods[0]["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn1.2xlarge"}


def test_precompile_is_an_init_step_with_the_same_env() -> None:
    c = render(load_sample("trn1-bert-ja-1core-fp32"))
    init = c.pods[0]["spec"]["initContainers"]
    assert [i["name"] for i in init] == ["precompile"]  # rank 0 waits for nobody
    assert init[0]["command"] == ["ftjob-runtime", "launch", "--precompile"]
    env = env_of(init[0])
    assert env["FTJOB_MODE"] == "precompile" and env["FTJOB_PRECOMPILE_STEPS"] == "16"
    assert init[0]["resources"] == c.pods[0]["spec"]["containers"][0]["resources"]


def test_trn1_32xlarge_multi_node_uses_efa_and_root_comm_id() -> None:
    c = render(
        make_job("big")
        .profile("trn1")
        .instance("trn1.32xlarge")
        .nodes(2)
        .classification()
        .training(precision="bf16")
        .build()
    )
    assert c.layout.procs_per_node == 32 and c.layout.world_size == 64
    rank1 = pod(c, "big-rank-1")
    res = rank1["spec"]["containers"][0]["resources"]
    assert res["limits"]["aws.amazon.com/neuron"] == "16"
    assert res["limits"]["vpc.amazonaws.com/efa"] == "8"
    assert res["limits"]["hugepages-2Mi"] == "5120Mi"
    env = env_of(rank1["spec"]["containers"][0])
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NEURON_RT_ROOT_COMM_ID"] == "big-rank-0.big.default.svc:46820"
    assert env["CCOM_SOCKET_IFNAME"] == "eth0"
    assert env["FTJOB_NODE_RANK"] == "1"
    wait = rank1["spec"]["initContainers"][0]
    assert wait["command"][:4] == ["ftjob-runtime", "wait-for", "--dns", "big-rank-0.big.default.svc"]


@pytest.mark.parametrize(
    ("procs", "resource", "count"),
    [(8, "aws.amazon.com/neuron", "4"), (16, "aws.amazon.com/neuron", "8"), (1, "aws.amazon.com/neuroncore", "1")],
)
def test_trn1_device_counts(procs: int, resource: str, count: str) -> None:
    c = render(make_job().profile("trn1").instance("trn1.32xlarge").procs(procs).classification().build())
    assert c.pods[0]["spec"]["containers"][0]["resources"]["limits"][resource] == count


def _one_per_node_terms(p: dict[str, Any]) -> list[Any]:
    anti = p["spec"].get("affinity", {}).get("podAntiAffinity", {})
    return [t for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) if t["topologyKey"] == HOSTNAME]


HOSTNAME = "kubernetes.io/hostname"


@pytest.mark.parametrize(
    ("job", "roles"),
    [
        (make_job("big").profile("trn1").instance("trn1.32xlarge").nodes(2).classification(), ["rank"] * 2),
        (make_job("spr").profile("xeon-amx").instance("m7i.metal-48xl").nodes(3).qa(), ["worker"] * 3),
        (make_job("gpu").profile("nvidia").instance("p5.48xlarge").nodes(2).qa(), ["rank"] * 2),
        (make_job("cpu").profile("cpu").instance("m7i.xlarge").nodes(2).classification(), ["rank"] * 2),
    ],
    ids=["trn1.32xlarge", "m7i.metal-48xl-mpi", "p5.48xlarge", "cpu-m7i.xlarge"],
)
def test_whole_node_pods_of_a_multi_node_job_go_one_per_node(job: Any, roles: list[str]) -> None:
    """Each rank pod takes a whole instance: a required anti-affinity on the node's hostname between the job's
    pods of that role keeps any two off one node. The MPI launcher is not a rank: it goes wherever it fits."""
    c = render(job.build())
    assert c.layout.whole_node
    holders = [p for p in c.pods if p["metadata"]["labels"][LABEL_ROLE] != "launcher"]
    assert [p["metadata"]["labels"][LABEL_ROLE] for p in holders] == roles
    name = c.names.job
    for p in holders:
        assert _one_per_node_terms(p) == [
            {
                "labelSelector": {"matchLabels": {"finetune.dev/job-name": name, LABEL_ROLE: roles[0]}},
                "topologyKey": HOSTNAME,
            }
        ]
        # The selector matches the pod itself and its peers, and no pod of another job.
        assert p["metadata"]["labels"]["finetune.dev/job-name"] == name
    launcher = [p for p in c.pods if p["metadata"]["labels"][LABEL_ROLE] == "launcher"]
    assert all("affinity" not in p["spec"] for p in launcher)


@pytest.mark.parametrize(
    "job",
    [
        make_job("one").profile("trn1").instance("trn1.32xlarge").nodes(1).classification(),  # a single pod
        make_job("part").profile("trn1").instance("trn1.32xlarge").nodes(2).procs(8).classification(),  # 4 of 16
        make_job("half").profile("nvidia").instance("g5.12xlarge").nodes(2).procs(2).qa(),  # 2 of 4 GPUs
        make_job("sized").profile("cpu").nodes(2).classification(),  # no instance type: sized from resources
    ],
    ids=["single-node", "trn1-4-of-16-devices", "g5.12xlarge-2-of-4-gpus", "cpu-no-instance-type"],
)
def test_pods_that_share_a_node_get_no_anti_affinity(job: Any) -> None:
    c = render(job.build())
    assert all(_one_per_node_terms(p) == [] and "affinity" not in p["spec"] for p in c.pods)


def test_one_per_node_is_added_to_the_users_affinity() -> None:
    """spec.hardware.affinity keeps its own terms (node affinity, the user's anti-affinity); the operator's term
    is added to the required list, not put in place of it."""
    users = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": HOSTNAME}
            ]
        },
    }
    job = make_job("big").profile("trn1").instance("trn1.32xlarge").nodes(2).classification()
    c = render(job.set("spec.hardware.affinity", users).build())
    affinity = pod(c, "big-rank-1")["spec"]["affinity"]
    assert affinity["nodeAffinity"] == users["nodeAffinity"]
    required = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required[0] == users["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert required[1]["labelSelector"]["matchLabels"]["finetune.dev/job-name"] == "big"
    assert len(required) == 2


def test_xeon_threads_hostfile_and_guaranteed_qos() -> None:
    c = render(load_sample("xeon-distilbert-squad"))
    assert c.layout.launcher == "mpi" and c.layout.world_size == 8
    worker = pod(c, "distilbert-squad-xeon-worker-0")["spec"]["containers"][0]
    env = env_of(worker)
    # m7i.metal-48xl: 192 vCPUs - 4 reserved = 188 -> 94 cores -> 47 per rank, all OMP threads: the default stack
    # (upstream) has no oneCCL, so no core goes to its progress threads
    assert env["OMP_NUM_THREADS"] == "47" and "CCL_WORKER_COUNT" not in env
    assert not [k for k in env if k.startswith("CCL_")]
    assert env["FTJOB_BACKEND"] == "xeon-upstream"
    assert worker["image"].startswith("finetune-operator/xeon-upstream:")
    assert env["KMP_HW_SUBSET"] == "1T"
    assert env["LD_PRELOAD"].endswith("libtcmalloc.so.4")
    res = worker["resources"]
    assert res["requests"]["cpu"] == res["limits"]["cpu"] == "188"  # Guaranteed, whole cores per rank
    assert res["requests"]["memory"] == res["limits"]["memory"]
    sel = pod(c, "distilbert-squad-xeon-worker-0")["spec"]["nodeSelector"]
    assert sel["feature.node.kubernetes.io/cpu-cpuid.AMXBF16"] == "true"
    cm = next(o for o in c.objects if o["kind"] == "ConfigMap")
    assert cm["data"]["hostfile"].splitlines() == [
        f"distilbert-squad-xeon-worker-{i}.distilbert-squad-xeon.default.svc:2" for i in range(4)
    ]


def test_xeon_ipex_stack_gives_oneccl_its_cores_and_its_image() -> None:
    """The seed's stack: 2 oneCCL progress threads per rank come out of its 47 cores, and the IPEX image."""
    c = render(load_sample("xeon-distilbert-squad-ipex"))
    assert c.layout.stack.name == "ipex"
    worker = pod(c, "distilbert-squad-xeon-ipex-worker-0")["spec"]["containers"][0]
    env = env_of(worker)
    assert env["OMP_NUM_THREADS"] == "45" and env["CCL_WORKER_COUNT"] == "2"
    assert env["CCL_WORKER_AFFINITY"] == "auto" and env["CCL_ATL_TRANSPORT"] == "mpi"
    assert env["FTJOB_BACKEND"] == "xeon"
    assert worker["image"].startswith("finetune-operator/xeon:")
    # Everything but the stack is the same job: the same hostfile shape and resources as the upstream sample.
    upstream = pod(render(load_sample("xeon-distilbert-squad")), "distilbert-squad-xeon-worker-0")
    assert worker["resources"] == upstream["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize(
    ("profile", "stack", "backend", "image", "cache"),
    [
        ("trn1", None, "neuron", "finetune-operator/neuron", ("NEURON_COMPILE_CACHE_URL", "/cache/neuron")),
        ("trn2", None, "neuron", "finetune-operator/neuron", ("NEURON_COMPILE_CACHE_URL", "/cache/neuron")),
        ("trn2", "xla", "neuron", "finetune-operator/neuron", ("NEURON_COMPILE_CACHE_URL", "/cache/neuron")),
        (
            "trn2",
            "native",
            "neuron-native",
            "finetune-operator/neuron-native",
            ("TORCH_NEURONX_NEFF_CACHE_DIR", "/cache/neuron-neff"),
        ),
        ("xeon-amx", None, "xeon-upstream", "finetune-operator/xeon-upstream", None),
        ("xeon-amx", "ipex", "xeon", "finetune-operator/xeon", None),
        ("cpu", None, "cpu", "finetune-operator/cpu", None),
        ("nvidia", "upstream", "nvidia", "finetune-operator/nvidia", None),
    ],
)
def test_the_stack_chooses_backend_image_and_compile_cache(
    profile: str, stack: str | None, backend: str, image: str, cache: tuple[str, str] | None
) -> None:
    job = make_job().profile(profile).classification().training(precision="bf16")
    if stack:
        job.set("spec.hardware.stack", stack)
    c = render(job.build())
    ctr = c.pods[0]["spec"]["containers"][0]
    env = env_of(ctr)
    assert env["FTJOB_BACKEND"] == backend
    assert ctr["image"].rsplit(":", 1)[0] == image
    caches = {"NEURON_COMPILE_CACHE_URL", "TORCH_NEURONX_NEFF_CACHE_DIR"} & set(env)
    assert {(k, env[k]) for k in caches} == ({cache} if cache else set())
    # bf16 on XLA casts the model (stochastic rounding on); every other stack autocasts
    assert ("NEURON_RT_STOCHASTIC_ROUNDING_EN" in env) == (backend == "neuron")


def test_a_cache_url_replaces_the_xla_cache_directory() -> None:
    c = render(make_job().profile("trn2").classification().cache(url="s3://b/neff").build())
    assert env_of(c.pods[0]["spec"]["containers"][0])["NEURON_COMPILE_CACHE_URL"] == "s3://b/neff"


def test_mpi_launcher_waits_for_dns_and_ssh_of_every_worker() -> None:
    c = render(load_sample("xeon-distilbert-squad"))
    launcher = pod(c, "distilbert-squad-xeon-launcher")
    wait = launcher["spec"]["initContainers"][0]["command"]
    for i in range(4):
        host = f"distilbert-squad-xeon-worker-{i}.distilbert-squad-xeon.default.svc"
        assert ["--dns", host, "--ssh", host] == wait[wait.index(host) - 1 : wait.index(host) + 3]
    assert launcher["spec"]["containers"][0]["command"] == ["ftjob-runtime", "mpirun"]
    assert "nodeSelector" not in launcher["spec"]  # the launcher does not take an accelerator node's slot
    vols = {v["name"]: v for v in launcher["spec"]["volumes"]}
    assert vols["ssh"]["secret"]["defaultMode"] == 0o400


def test_openmpi_hostfile_format() -> None:
    c = render(make_job("o").nodes(2).procs(2).launcher("mpi", "openmpi").classification().build())
    cm = next(o for o in c.objects if o["kind"] == "ConfigMap")
    assert cm["data"]["hostfile"] == "o-worker-0.o.default.svc slots=2\no-worker-1.o.default.svc slots=2\n"


def test_ssh_secret_is_immutable_and_complete() -> None:
    c = render(load_sample("cpu-distilbert-squad-mpi"))
    secret = next(o for o in c.objects if o["kind"] == "Secret")
    assert secret["immutable"] is True
    assert base64.b64decode(secret["data"]["authorized_keys"]).decode() == KEYS.public_key
    assert set(secret["data"]) == {
        "id_ed25519",
        "id_ed25519.pub",
        "authorized_keys",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
        "known_hosts",
    }


def test_known_hosts_lists_every_worker_name_with_the_host_key() -> None:
    c = render(make_job("kh", namespace="team").nodes(3).procs(2).launcher("mpi", "mpich").classification().build())
    secret = next(o for o in c.objects if o["kind"] == "Secret")
    known = base64.b64decode(secret["data"]["known_hosts"]).decode()
    # Each worker's hostfile name and short Service name, at the sshd port; the key without its comment.
    assert known.splitlines() == [
        f"[kh-worker-{i}.kh.team.svc]:2222,[kh-worker-{i}.kh]:2222 ssh-ed25519 BBBB" for i in range(3)
    ]
    hosts = [
        ln.split(":")[0]
        for ln in next(o for o in c.objects if o["kind"] == "ConfigMap")["data"]["hostfile"].splitlines()
    ]
    assert all(f"[{h}]:2222," in known for h in hosts)


def test_each_mpi_role_mounts_only_its_own_keys() -> None:
    """The launcher (ssh client) gets the client key and known_hosts; workers (sshd) get the host key and
    authorized_keys, never the client's private key."""
    c = render(load_sample("xeon-distilbert-squad"))
    want = {
        "launcher": ["id_ed25519", "id_ed25519.pub", "known_hosts"],
        "worker": ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "authorized_keys"],
    }
    roles = set()
    for p in c.pods:
        role = p["metadata"]["labels"][LABEL_ROLE]
        roles.add(role)
        vol = next(v for v in p["spec"]["volumes"] if v["name"] == "ssh")["secret"]
        assert [i["key"] for i in vol["items"]] == want[role], p["metadata"]["name"]
        assert all(i["path"] == i["key"] for i in vol["items"]) and vol["defaultMode"] == 0o400
    assert roles == {"launcher", "worker"}
    secret = next(o for o in c.objects if o["kind"] == "Secret")
    assert set(want["launcher"]) | set(want["worker"]) == set(secret["data"]), "every key is mounted somewhere"


def test_nvidia_gpus_and_efa_without_fi_vars() -> None:
    c = render(load_sample("nvidia-distilbert-squad"))
    ctr = c.pods[0]["spec"]["containers"][0]
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert ctr["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert "FI_PROVIDER" not in env_of(ctr)  # aws-ofi-nccl >= 1.7 needs none
    # the job's own location under output.url (test_output_location.py)
    assert env_of(ctr)["FTJOB_OUTPUT_URL"] == "s3://my-bucket/distilbert-squad/nvidia/default/distilbert-squad-nvidia/"
    vols = {v["name"]: v for v in c.pods[0]["spec"]["volumes"]}
    assert "emptyDir" in vols["output"]  # scratch, uploaded by the runtime
    assert c.pods[0]["spec"]["serviceAccountName"] == "finetune-s3-writer"


def test_cpu_threads_from_requests_not_host() -> None:
    c = render(make_job().procs(2).set("spec.hardware.resources", {"requests": {"cpu": "6"}}).classification().build())
    assert env_of(c.pods[0]["spec"]["containers"][0])["OMP_NUM_THREADS"] == "3"


def test_bring_your_own_command_gets_rank_env_only() -> None:
    c = render(make_job("byo").nodes(2).command("python", "train.py").build())
    ctr = pod(c, "byo-rank-1")["spec"]["containers"][0]
    assert ctr["command"] == ["python", "train.py"]
    env = env_of(ctr)
    assert env["MASTER_ADDR"] == "byo-rank-0.byo.default.svc" and env["NODE_RANK"] == "1"
    # torchrun's own defaults (Kubeflow's PyTorchJob sets the same): a bare `torchrun train.py` joins one world.
    assert {k: v for k, v in env.items() if k.startswith("PET_")} == {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "byo-rank-0.byo.default.svc",
        "PET_MASTER_PORT": "29500",
    }
    builtin = render(make_job("own").nodes(2).classification().build())  # the runtime's launch passes flags
    assert not any(k.startswith("PET_") for k in env_of(pod(builtin, "own-rank-1")["spec"]["containers"][0]))
    cfg = next(o for o in c.objects if o["kind"] == "ConfigMap")
    assert '"task": null' in cfg["data"]["config.json"]


def test_user_env_wins_and_hf_token_from_secret() -> None:
    job = (
        make_job()
        .classification()
        .set("spec.env", [{"name": "TOKENIZERS_PARALLELISM", "value": "false"}])
        .set("spec.hfTokenSecretRef", {"name": "hf"})
        .build()
    )
    env = render(job).pods[0]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "TOKENIZERS_PARALLELISM"] == [
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"}
    ]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in env


def test_children_are_owned_labelled_and_deterministic() -> None:
    job = make_job("d", "ns1").nodes(3).classification().run_policy(queueName="team-a").build()
    job["metadata"]["uid"] = "u-1"
    a, b = render(job), render(job)
    assert a.all() == b.all()
    for obj in a.all():
        ref = obj["metadata"]["ownerReferences"][0]
        assert ref == {
            "apiVersion": "finetune.dev/v1alpha1",
            "kind": "FineTuneJob",
            "name": "d",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert obj["metadata"]["namespace"] == "ns1"
        assert obj["metadata"]["labels"]["finetune.dev/job-name"] == "d"
    names = [p["metadata"]["name"] for p in a.pods]
    assert names == ["d-rank-0", "d-rank-1", "d-rank-2"]
    for i, p in enumerate(a.pods):
        assert p["spec"]["hostname"] == f"d-rank-{i}" and p["spec"]["subdomain"] == "d"
        # Queued through the operator's Workload, never Kueue's pod integration (which would gate them twice).
        assert not [k for k in p["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
        assert "annotations" not in p["metadata"]
        assert p["spec"]["restartPolicy"] == "Never"
        assert p["spec"]["automountServiceAccountToken"] is False
        assert p["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    svc = a.objects[0]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_images_from_profile_repository_with_config_registry_and_tag() -> None:
    """The profile names the repository; the operator's config the registry and the tag (default: its version)."""
    job = make_job().classification().build()
    image = render(job).pods[0]["spec"]["containers"][0]["image"]
    assert image == f"finetune-operator/cpu:{__version__}"
    got = render(job, images={"registry": "registry.local:5000/ft", "tag": "9"}).pods[0]["spec"]["containers"][0]
    assert got["image"] == "registry.local:5000/ft/finetune-operator/cpu:9"
    assert render(job, images={"tag": "9"}).pods[0]["spec"]["containers"][0]["image"] == "finetune-operator/cpu:9"
    job["spec"]["image"] = "mine:1"
    assert render(job, images={"registry": "x.io"}).pods[0]["spec"]["containers"][0]["image"] == "mine:1"


def test_runtime_config_spells_out_defaults() -> None:
    import json

    c = render(make_job().classification().build())
    cfg = json.loads(next(o for o in c.objects if o["kind"] == "ConfigMap")["data"]["config.json"])
    assert cfg["training"]["precision"] == "fp32" and cfg["training"]["checkpointEverySteps"] == 500
    assert cfg["compileCache"] == {"precompile": False, "precompileSteps": 16}
    assert cfg["task"]["dataset"]["labelMap"] == {"1": 0, "2": 0, "4": 1, "5": 1}


PINNED_K8S = "1.37"  # tools/cluster pins v1.37.2; kubernetes-validate ships that minor's schemas


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_rendered_objects_validate_against_pinned_openapi(sample: Path) -> None:
    """Strict: unknown fields fail too (the API server would silently drop a misspelt one)."""
    import kubernetes_validate

    for obj in render(yaml.safe_load(sample.read_text())).all():
        used = kubernetes_validate.validate(obj, PINNED_K8S, strict=True)
        assert used == PINNED_K8S, f"{obj['kind']}/{obj['metadata']['name']} validated against {used}"


def test_network_policy_isolates_each_job_when_enabled() -> None:
    job = make_job("iso", "ns").nodes(2).classification().build()
    assert not [o for o in render(job).objects if o["kind"] == "NetworkPolicy"]  # off unless configured
    extra = {"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}], "ports": [{"port": 9100}]}
    c = render(job, network_policy_config={"enabled": True, "extraIngress": [extra]})
    (np,) = [o for o in c.objects if o["kind"] == "NetworkPolicy"]
    same_job = {"finetune.dev/job-name": "iso", "app.kubernetes.io/managed-by": "finetune-operator"}
    assert np["spec"]["podSelector"] == {"matchLabels": same_job}
    assert np["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": same_job}}]}, extra]
    assert np["spec"]["policyTypes"] == ["Ingress"]  # egress open: DNS, datasets, S3
    for p in c.pods:  # the policy selects every pod of the job, and only them
        assert all(p["metadata"]["labels"][k] == v for k, v in same_job.items())
    import kubernetes_validate

    assert kubernetes_validate.validate(np, PINNED_K8S, strict=True) == PINNED_K8S


def test_cpu_quantities_in_any_unit_size_threads() -> None:
    for cpu, threads in (("2k", "2000"), ("4", "4"), ("3500m", "3"), ("8e0", "8"), (6, "6")):
        job = make_job().classification().set("spec.hardware.resources", {"requests": {"cpu": cpu}}).build()
        ctr = render(job).pods[0]["spec"]["containers"][0]
        assert env_of(ctr)["OMP_NUM_THREADS"] == threads, cpu
        assert ctr["resources"]["requests"]["cpu"] == str(cpu)  # `cpu: 6` in the spec, "6" in the pod


def test_a_derived_request_is_lowered_to_the_users_limit() -> None:
    """xeon-amx sizes requests from the instance; a lower user limit must not leave request > limit, which the
    API server refuses."""
    job = (
        make_job()
        .profile("xeon-amx")
        .instance("m7i.metal-48xl")
        .classification()
        .set("spec.hardware.resources", {"limits": {"cpu": "8", "memory": "16Gi"}})
        .build()
    )
    res = render(job).pods[0]["spec"]["containers"][0]["resources"]
    assert res["requests"]["cpu"] == "8" and res["limits"]["cpu"] == "8"
    assert res["requests"]["memory"] == "16Gi"


def test_each_job_mounts_only_its_own_directory_of_a_shared_output_claim() -> None:
    def output_mount(name: str, namespace: str, path: str | None) -> tuple[str, dict[str, Any]]:
        job = make_job(name, namespace).classification().set("spec.output", {"claimName": "results"})
        if path:
            job.set("spec.output.path", path)
        ctr = render(job.build()).pods[0]["spec"]["containers"][0]
        mount = next(m for m in ctr["volumeMounts"] if m["name"] == "output")
        return env_of(ctr)["FTJOB_OUTPUT_DIR"], mount

    out, mount = output_mount("a", "team-1", "bert/run/")
    assert out == mount["mountPath"] == "/output" and mount["subPath"] == "bert/run/team-1/a"
    # Same claim and path: another job, or the same name in another namespace, gets another directory.
    assert output_mount("b", "team-1", "bert/run")[1]["subPath"] == "bert/run/team-1/b"
    assert output_mount("a", "team-2", "bert/run")[1]["subPath"] == "bert/run/team-2/a"
    assert output_mount("a", "team-1", None)[1]["subPath"] == "team-1/a"


def test_the_compile_cache_claim_is_shared_at_its_cache_folder_never_whole() -> None:
    """Jobs reuse each other's compiled graphs, but a cache claim that is also some job's output claim must not
    expose that job's checkpoints and models (issue 23): the cache mount is the claim's .finetune-cache folder,
    the outputs are <path>/<namespace>/<job> folders beside it."""
    shared = "finetune-cache"
    for name in ("a", "b"):
        job = make_job(name, "ns").classification().cache(claimName=shared).set("spec.output", {"claimName": shared})
        pod0 = render(job.build()).pods[0]
        mounts = {m["name"]: m for m in pod0["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["cache"] == {"name": "cache", "mountPath": "/cache", "subPath": ".finetune-cache"}
        assert mounts["output"]["subPath"] == f"ns/{name}"
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod0["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        assert claims == {"cache": shared, "output": shared}
    # Without a claim the cache is the pod's own emptyDir, mounted whole.
    pod0 = render(make_job("c", "ns").classification().build()).pods[0]
    mount = next(m for m in pod0["spec"]["containers"][0]["volumeMounts"] if m["name"] == "cache")
    assert mount == {"name": "cache", "mountPath": "/cache"}


def test_workload_has_one_pod_set_per_role_sized_like_the_pods() -> None:
    from finetune_operator.builders.workload import workload

    job = validate(
        make_job("w", "ns1")
        .nodes(2)
        .classification()
        .run_policy(queueName="team-a")
        .set("spec.hardware.nodeSelector", {"pool": "a"})
        .build()
    )
    job["metadata"]["uid"] = "u-1"
    ch = render(job)
    wl = workload(job, ch.layout, ch.names, ch.pods)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["metadata"]["name"] == "w"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert wl["spec"]["queueName"] == "team-a"
    [ps] = wl["spec"]["podSets"]
    assert ps["name"] == "rank" and ps["count"] == 2
    trainer = ch.pods[1]["spec"]["containers"][0]
    assert ps["template"]["spec"]["containers"] == [
        {"name": "trainer", "image": trainer["image"], "resources": trainer["resources"]}
    ]
    assert [c["name"] for c in ps["template"]["spec"]["initContainers"]] == ["wait-for-peers"]
    assert ps["template"]["spec"]["nodeSelector"] == {"pool": "a"}

    mpi = validate(
        make_job("m", "ns1")
        .nodes(2)
        .launcher("mpi", "mpich")
        .qa()
        .set("spec.task.docStride", 32)
        .run_policy(queueName="q")
        .build()
    )
    ch = render(mpi)
    sets = {ps["name"]: ps["count"] for ps in workload(mpi, ch.layout, ch.names, ch.pods)["spec"]["podSets"]}
    assert sets == {"worker": 2, "launcher": 1}


def flavor(
    name: str,
    labels: dict[str, str] | None = None,
    tolerations: list[Any] | None = None,
    taints: list[Any] | None = None,
) -> dict[str, Any]:
    spec = {"nodeLabels": labels or {}, "tolerations": tolerations or [], "nodeTaints": taints or []}
    return {"kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def test_admitted_flavors_place_their_node_labels_and_tolerations_on_each_pod_set() -> None:
    """As Kueue's podset.FromAssignment + Merge: every flavor of a pod set adds its nodeLabels and tolerations
    (once each), nodeTaints add nothing, and each MPI pod set gets its own flavors."""
    from finetune_operator.builders.flavors import assigned_flavors, placements

    tol = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    flavors = {
        "spr": flavor("spr", {"pool": "spr", "zone": "a"}, [tol], taints=[{"key": "x", "effect": "NoSchedule"}]),
        "gpu-mem": flavor("gpu-mem", {"zone": "a"}, [tol]),
        "small": flavor("small", {"pool": "small"}),
    }
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "worker", "count": 2, "flavors": {"cpu": "spr", "memory": "gpu-mem"}},
            {"name": "launcher", "count": 1, "flavors": {"cpu": "small", "memory": "small"}},
        ],
    }
    assert assigned_flavors(admission) == ["spr", "gpu-mem", "small"]
    job = validate(
        make_job("m", "ns1")
        .nodes(2)
        .launcher("mpi", "mpich")
        .qa()
        .set("spec.task.docStride", 32)
        .set("spec.hardware.tolerations", [tol])
        .run_policy(queueName="q")
        .build()
    )
    ch = render(job, placements=placements(admission, flavors))
    workers = [p for p in ch.pods if p["metadata"]["labels"][LABEL_ROLE] == "worker"]
    [launcher] = [p for p in ch.pods if p["metadata"]["labels"][LABEL_ROLE] == "launcher"]
    for w in workers:
        assert w["spec"]["nodeSelector"]["pool"] == "spr" and w["spec"]["nodeSelector"]["zone"] == "a"
        assert w["spec"]["tolerations"].count(tol) == 1  # the job's own and both flavors' are the same one
        assert not any(t.get("key") == "x" for t in w["spec"]["tolerations"])
    assert launcher["spec"]["nodeSelector"] == {"pool": "small"} and "tolerations" not in launcher["spec"]
    # Without placements (no queue, or `ftjob render`) the pods are as before.
    plain = render(job)
    assert all("pool" not in (p["spec"].get("nodeSelector") or {}) for p in plain.pods)


def test_a_flavor_label_never_overrides_the_jobs_own_node_selector() -> None:
    from finetune_operator.builders.flavors import Placement, conflicts, place

    p = Placement(("spr",), {"pool": "spr", "zone": "a"})
    assert conflicts({"pool": "trn1", "zone": "a"}, p) == [("pool", "trn1", "spr")]
    assert place({"nodeSelector": {"zone": "a"}}, p) == {"nodeSelector": {"pool": "spr", "zone": "a"}}
    with pytest.raises(ValueError, match="conflicts"):
        place({"nodeSelector": {"pool": "trn1"}}, p)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_desired_shares_no_container_between_children_or_with_the_job(sample: Path) -> None:
    """Callers mutate the children freely (reconcile adds labels, the CLI serialises): builders.tree_copy must
    leave no dict or list shared between two places, or with the job they came from."""
    job = validate(yaml.safe_load(sample.read_text()))
    job["metadata"]["uid"] = "u"
    children = desired(job, ssh_keys=KEYS)
    seen: dict[int, str] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict | list):
            assert id(value) not in seen, f"{path} is the same object as {seen[id(value)]}"
            seen[id(value)] = path
            for k, v in value.items() if isinstance(value, dict) else enumerate(value):
                walk(v, f"{path}.{k}")

    walk(job, "job")
    walk(children.all(), "children")
