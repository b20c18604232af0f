"""The pure reconcile, driven through whole lifecycles with pod statuses as a kubelet would report them."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

from ftjobs import load_sample, make_job

from finetune_operator.admission import validate
from finetune_operator.builders import SshKeys
from finetune_operator.reconcile import Observed, Plan, reconcile

T0 = datetime(2026, 12, 2, 10, 0, 0)
KEYS = SshKeys("k", "p", "hk", "hp")


class World:
    """A job plus the pods and objects that exist, advanced by applying plans like the operator does."""

    def __init__(self, job: dict[str, Any]):
        self.job = validate(job)
        self.job["metadata"].setdefault("uid", "uid-1")
        self.job["status"] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.objects: dict[str, str | None] = {}  # Kind/name -> controller uid, as the indexes hold them
        self.now = T0
        self.deleted_job = False
        self.workload: dict[str, Any] | None = None  # the Kueue Workload, as created by a plan
        self.flavors: dict[str, dict[str, Any]] = {}  # ResourceFlavors the loop could read, by name

    def step(self, progress: dict[str, Any] | None = None, seconds: float = 1) -> Plan:
        self.now += timedelta(seconds=seconds)
        plan = reconcile(
            self.job,
            Observed(
                list(copy.deepcopy(self.pods).values()),
                dict(self.objects),
                self.now,
                progress,
                lambda: KEYS,
                copy.deepcopy(self.workload),
                copy.deepcopy(self.flavors),
            ),
        )
        for name in plan.delete_pods:
            self.pods[name]["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
        for obj in plan.create:
            if obj["kind"] == "Pod":
                assert obj["metadata"]["name"] not in self.pods, "created a pod whose name is taken"
                self.pods[obj["metadata"]["name"]] = copy.deepcopy(obj) | {"status": {"phase": "Pending"}}
            elif obj["kind"] == "Workload":
                assert self.workload is None, "created a second Workload"
                self.workload = copy.deepcopy(obj) | {"status": {}}
                self.workload["metadata"]["resourceVersion"] = "1"
            else:
                self.objects[f"{obj['kind']}/{obj['metadata']['name']}"] = obj["metadata"]["ownerReferences"][0]["uid"]
        self.job["status"] = plan.status
        self.deleted_job = plan.delete_job
        return plan

    def kueue(self, *conditions: tuple[str, str, str, str], admission: bool | dict[str, Any] | None = None) -> None:
        """Kueue writes the Workload's status: (type, status, reason, message) conditions, and admission."""
        assert self.workload is not None
        st = self.workload["status"]
        conds = {c["type"]: c for c in st.get("conditions", [])}
        for ctype, status, reason, message in conditions:
            conds[ctype] = {"type": ctype, "status": status, "reason": reason, "message": message}
        st["conditions"] = list(conds.values())
        if admission is not None:
            plain = {"clusterQueue": "cq"} if admission else None
            st["admission"] = admission if isinstance(admission, dict) else plain

    def gone(self) -> None:
        """The kubelet finished deleting every terminating pod."""
        self.pods = {k: v for k, v in self.pods.items() if not v["metadata"].get("deletionTimestamp")}

    def set_phase(self, name: str, phase: str, **status: Any) -> None:
        self.pods[name]["status"] = {"phase": phase, **status}

    def all_phase(self, phase: str) -> None:
        for name in self.pods:
            self.set_phase(name, phase)

    @property
    def phase(self) -> str:
        return str(self.job["status"].get("phase"))


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}
        ]
    }


def job2(**run_policy: Any) -> dict[str, Any]:
    b = make_job("j", "ns").nodes(2).classification()
    if run_policy:
        b.run_policy(**run_policy)
    return b.build()


def test_creates_everything_once_then_converges() -> None:
    w = World(job2())
    plan = w.step()
    assert sorted(o["kind"] for o in plan.create) == ["ConfigMap", "Pod", "Pod", "Service"]
    assert w.phase == "Pending" and w.job["status"]["startTime"] == "2026-12-02T10:00:01Z"
    assert w.job["status"]["ranks"] == {"ready": 0, "total": 2}
    assert w.job["status"]["worldSize"] == 2
    again = w.step()
    assert again.create == [] and again.delete_pods == [] and again.events == []


def test_running_then_succeeded_keeps_finished_pods() -> None:
    w = World(job2())
    w.step()
    w.all_phase("Running")
    p = w.step()
    assert w.phase == "Running" and w.job["status"]["ranks"] == {"ready": 2, "total": 2}
    assert ("Normal", "Running", "2 processes on 2 pod(s)") in p.events
    w.all_phase("Succeeded")
    w.step()
    assert w.phase == "Succeeded" and w.job["status"]["completionTime"]
    cond = {c["type"]: c["status"] for c in w.job["status"]["conditions"]}
    assert cond["Succeeded"] == "True" and cond["Running"] == "False"
    after = w.step()
    assert after.delete_pods == [] and after.create == []  # finished pods stay for their logs


def test_precompiling_phase_from_init_container() -> None:
    w = World(make_job("p").classification().cache(precompile=True).build())
    w.step()
    w.set_phase("p-rank-0", "Pending", initContainerStatuses=[{"name": "precompile", "state": {"running": {}}}])
    w.step()
    assert w.phase == "Precompiling"


def _trial(message: str, code: int = 0) -> list[dict[str, Any]]:
    return [{"name": "precompile", "state": {"terminated": {"exitCode": code, "message": message}}}]


WARM = (
    '{"compileCache":{"warm":true,"graphHits":4,"graphMisses":0,"entriesBefore":9,"entriesAfter":9,'
    '"trialSeconds":8.6,"steps":16,"injected":"x"}}'
)


def test_compile_cache_report_from_the_trials_termination_message() -> None:
    w = World(make_job("p").nodes(2).classification().cache(precompile=True).build())
    w.step()
    w.set_phase("p-rank-1", "Running", initContainerStatuses=_trial(WARM.replace("true", "false")))
    w.set_phase("p-rank-0", "Running", initContainerStatuses=_trial(WARM))
    plan = w.step()
    assert w.job["status"]["compileCache"] == {
        "warm": True,
        "graphHits": 4,
        "graphMisses": 0,
        "entriesBefore": 9,
        "entriesAfter": 9,
        "trialSeconds": 8.6,
        "steps": 16,
        "attempt": 0,
    }
    assert (
        "Normal",
        "CompileCache",
        "compile cache warm: 4 graph(s) from the cache, 0 compiled; trial 8.6 s",
    ) in plan.events
    assert w.step().events == []  # level-triggered: the same report again is no news
    w.all_phase("Succeeded")
    w.step()
    assert w.phase == "Succeeded" and w.job["status"]["compileCache"]["warm"] is True


def test_compile_cache_report_ignores_failed_or_malformed_trials() -> None:
    for init in (
        _trial(WARM, code=1),
        _trial("boom: last log lines"),
        _trial('{"compileCache":{"warm":"yes"}}'),
        _trial('{"compileCache":{"warm":false,"graphHits":true,"steps":"2"}}'),
    ):
        w = World(make_job("p").classification().cache(precompile=True).build())
        w.step()
        w.set_phase("p-rank-0", "Running", initContainerStatuses=init)
        w.step()
        report = w.job["status"].get("compileCache")
        assert report in (None, {"warm": False, "attempt": 0}), report  # mistyped fields are dropped


def test_rank_failure_restarts_whole_group_then_succeeds() -> None:
    w = World(job2(backoffLimit=2))
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-1", "Failed", **terminated(1, message="RuntimeError: boom\n"))
    p = w.step()
    assert w.phase == "Restarting" and w.job["status"]["restartCount"] == 1
    assert sorted(p.delete_pods) == ["j-rank-0", "j-rank-1"]  # the healthy rank goes too
    assert "rank 1 (pod j-rank-1) failed: exit code 1" in w.job["status"]["message"]
    assert "RuntimeError: boom" in w.job["status"]["message"]
    assert w.job["status"]["failures"][-1]["exitCode"] == 1
    assert p.events[0][0] == "Warning"
    # Old pods still terminating: nothing is created under their names.
    assert w.step().create == [] and w.phase == "Restarting"
    w.gone()
    p = w.step()
    assert [o["metadata"]["labels"]["finetune.dev/attempt"] for o in p.create] == ["1", "1"]
    w.all_phase("Running")
    w.step()
    w.all_phase("Succeeded")
    w.step()
    assert w.phase == "Succeeded" and w.job["status"]["restartCount"] == 1


def test_backoff_limit_reached_fails_naming_rank_and_oom() -> None:
    w = World(job2(backoffLimit=0))
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-0", "Failed", **terminated(137, "OOMKilled", "loading shard 3\n"))
    p = w.step()
    st = w.job["status"]
    assert w.phase == "Failed" and st["reason"] == "OOMKilled"
    assert "rank 0 (pod j-rank-0) failed: OOMKilled (exit code 137)" in st["message"]
    assert "loading shard 3" in st["message"] and "backoffLimit 0 reached" in st["message"]
    assert p.delete_pods == ["j-rank-1"]  # nothing keeps running; the failed pod stays for its logs
    assert w.step().create == []  # terminal: never recreated


def test_clean_pod_policy_all_deletes_finished_pods() -> None:
    w = World(job2(cleanPodPolicy="All"))
    w.step()
    w.all_phase("Succeeded")
    p = w.step()
    assert w.phase == "Succeeded" and sorted(p.delete_pods) == ["j-rank-0", "j-rank-1"]


def test_suspend_and_resume() -> None:
    w = World(job2())
    w.step()
    w.all_phase("Running")
    w.step()
    w.job["spec"]["runPolicy"]["suspend"] = True
    p = w.step()
    assert w.phase == "Suspended" and sorted(p.delete_pods) == ["j-rank-0", "j-rank-1"]
    w.gone()
    assert w.step().create == []  # no pods while suspended
    w.job["spec"]["runPolicy"]["suspend"] = False
    p = w.step()
    assert len([o for o in p.create if o["kind"] == "Pod"]) == 2 and w.phase == "Pending"
    assert w.job["status"]["restartCount"] == 0  # a resume is not a failure
    cond = {c["type"]: c["status"] for c in w.job["status"]["conditions"]}
    assert cond["Suspended"] == "False"


def test_active_deadline() -> None:
    w = World(job2(activeDeadlineSeconds=60))
    p = w.step()
    w.all_phase("Running")
    p = w.step(seconds=30)
    assert w.phase == "Running" and p.requeue_after is not None and 29 <= p.requeue_after <= 31
    p = w.step(seconds=31)
    assert w.phase == "Failed" and w.job["status"]["reason"] == "DeadlineExceeded"
    assert sorted(p.delete_pods) == ["j-rank-0", "j-rank-1"]


def test_ttl_after_finished_deletes_job() -> None:
    w = World(job2(ttlSecondsAfterFinished=100))
    w.step()
    w.all_phase("Succeeded")
    w.step()
    p = w.step(seconds=50)
    assert not p.delete_job and p.requeue_after is not None and 49 <= p.requeue_after <= 51
    assert w.step(seconds=60).delete_job


def test_mpi_launcher_success_stops_workers() -> None:
    w = World(load_sample("cpu-distilbert-squad-mpi"))
    p = w.step()
    assert {o["kind"] for o in p.create} == {"Service", "ConfigMap", "Secret", "Pod"}
    w.all_phase("Running")
    w.step()
    assert w.phase == "Running" and w.job["status"]["ranks"] == {"ready": 2, "total": 2}
    w.set_phase("distilbert-squad-cpu-launcher", "Succeeded")
    p = w.step()
    assert w.phase == "Succeeded"
    assert sorted(p.delete_pods) == ["distilbert-squad-cpu-worker-0", "distilbert-squad-cpu-worker-1"]


def test_unschedulable_and_image_errors_surface_in_status() -> None:
    w = World(make_job("u").profile("trn1").instance("trn1.32xlarge").procs(8).classification().build())
    w.step()
    w.set_phase(
        "u-rank-0",
        "Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: Insufficient aws.amazon.com/neuron.",
            }
        ],
    )
    w.step()
    assert w.job["status"]["reason"] == "Unschedulable"
    assert "Insufficient aws.amazon.com/neuron" in w.job["status"]["message"]
    w.set_phase(
        "u-rank-0",
        "Pending",
        containerStatuses=[
            {"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}}
        ],
    )
    w.step()
    assert w.job["status"]["message"] == "u-rank-0/trainer: ImagePullBackOff: pull access denied"


def test_progress_lands_in_status() -> None:
    w = World(job2())
    w.step()
    w.all_phase("Running")
    prog = {"event": "train", "step": 5, "totalSteps": 10, "summary": "5/10 (50%)"}
    w.step(progress=prog)
    assert w.job["status"]["progress"] == prog


def test_pod_gone_without_a_trace_is_recreated() -> None:
    # A force deletion (grace 0) is never seen terminating: the missing pod is simply created again.
    w = World(job2())
    w.step()
    del w.pods["j-rank-1"]
    p = w.step()
    assert [o["metadata"]["name"] for o in p.create] == ["j-rank-1"]


def test_running_pod_deleted_by_someone_else_restarts_the_group() -> None:
    w = World(job2(backoffLimit=2))
    w.step()
    w.all_phase("Running")
    w.step()
    w.pods["j-rank-1"]["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:05Z"  # kubectl delete / eviction
    p = w.step()
    assert w.phase == "Restarting" and w.job["status"]["restartCount"] == 1
    assert p.delete_pods == ["j-rank-0"]  # rank 1 is already going
    f = w.job["status"]["failures"][-1]
    assert f["rank"] == 1 and f["reason"] == "Deleted"
    assert "rank 1 (pod j-rank-1) failed: Deleted" in w.job["status"]["message"]
    w.gone()
    p = w.step()
    assert [o["metadata"]["labels"]["finetune.dev/attempt"] for o in p.create] == ["1", "1"]


def test_own_deletions_are_not_failures() -> None:
    # Restart: the old attempt's pods terminate while the new attempt waits; suspend; finished pods.
    w = World(job2(backoffLimit=2))
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-0", "Failed", **terminated(1))
    w.step()
    for _ in range(3):
        w.step()
        assert w.job["status"]["restartCount"] == 1 and w.phase == "Restarting"
    w.gone()
    w.step()
    w.all_phase("Running")
    w.step()
    w.job["spec"]["runPolicy"]["suspend"] = True
    w.step()
    w.step()
    assert w.phase == "Suspended" and w.job["status"]["restartCount"] == 1
    w.job["spec"]["runPolicy"]["suspend"] = False
    w.gone()
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-0", "Succeeded")
    w.pods["j-rank-0"]["metadata"]["deletionTimestamp"] = "2026-12-02T10:01:00Z"  # a finished rank cleaned up
    w.step()
    assert w.job["status"]["restartCount"] == 1


def test_network_policy_created_with_the_other_objects_when_configured() -> None:
    w = World(job2())
    plan = reconcile(w.job, Observed([], {}, T0, None, lambda: KEYS), {"networkPolicy": {"enabled": True}})
    assert "NetworkPolicy" in {o["kind"] for o in plan.create}
    plan = reconcile(w.job, Observed([], {}, T0, None, lambda: KEYS), {})
    assert "NetworkPolicy" not in {o["kind"] for o in plan.create}


PENDING = (
    "QuotaReserved",
    "False",
    "Pending",
    "couldn't assign flavors to pod set rank: insufficient unused quota for cpu in flavor default",
)
ADMITTED = [
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
]


def test_queued_job_makes_its_workload_and_no_pods_until_admitted() -> None:
    w = World(job2(queueName="team-a"))
    p = w.step()
    assert [o["kind"] for o in p.create] == ["Workload"] and w.phase == "Queued"
    assert w.workload is not None and w.workload["spec"]["queueName"] == "team-a"
    assert p.requeue_after is None  # no polling: the Workload's watch events wake the job
    w.kueue(PENDING)
    p = w.step()
    assert p.create == [] and not w.pods and w.phase == "Queued"
    assert w.job["status"]["reason"] == "Queued"
    assert "j in LocalQueue team-a: Pending: couldn't assign flavors" in w.job["status"]["message"]
    assert {c["type"]: c["status"] for c in w.job["status"]["conditions"]}["Queued"] == "True"
    w.kueue(*ADMITTED, admission=True)
    p = w.step()
    assert sorted(o["kind"] for o in p.create) == ["ConfigMap", "Pod", "Pod", "Service"]
    assert w.phase == "Pending" and w.job["status"]["startTime"]
    assert {c["type"]: c["status"] for c in w.job["status"]["conditions"]}["Queued"] == "False"


def test_queued_job_restart_keeps_its_workload_and_finish_marks_it_finished() -> None:
    w = World(job2(queueName="q", backoffLimit=1))
    w.step()
    w.kueue(*ADMITTED, admission=True)
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-0", "Failed", **terminated(1))
    p = w.step()
    assert w.phase == "Restarting" and p.workload_status is None
    w.gone()
    p = w.step()
    assert [o["kind"] for o in p.create] == ["Pod", "Pod"]  # the same admission, new pods
    w.all_phase("Succeeded")
    p = w.step()
    assert w.phase == "Succeeded" and p.workload_status is not None
    assert p.workload_status["metadata"] == {"resourceVersion": "1"}
    finished = [c for c in p.workload_status["status"]["conditions"] if c["type"] == "Finished"]
    assert finished and finished[0]["status"] == "True" and finished[0]["reason"] == "Succeeded"
    assert {c["type"] for c in p.workload_status["status"]["conditions"]} >= {"Admitted", "QuotaReserved"}
    # Until Kueue shows it Finished, later passes ask again; then never.
    assert w.step().workload_status is not None
    w.kueue(("Finished", "True", "Succeeded", "done"))
    assert w.step().workload_status is None


def test_evicted_job_stops_its_pods_then_releases_the_quota() -> None:
    w = World(job2(queueName="q"))
    w.step()
    w.kueue(*ADMITTED, admission=True)
    w.step()
    w.all_phase("Running")
    w.step()
    w.kueue(("Evicted", "True", "Preempted", "Preempted to accommodate a workload"))
    p = w.step()
    assert sorted(p.delete_pods) == ["j-rank-0", "j-rank-1"] and p.workload_status is None
    assert w.phase == "Queued" and "Preempted to accommodate" in w.job["status"]["message"]
    w.gone()
    p = w.step()
    assert p.workload_status is not None and p.workload_status["status"]["admission"] is None
    conds = {c["type"]: c["status"] for c in p.workload_status["status"]["conditions"]}
    assert conds["QuotaReserved"] == "False" and conds["Admitted"] == "False" and conds["Evicted"] == "True"


def on_flavor(name: str) -> dict[str, Any]:
    return {
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "rank", "count": 2, "flavors": {"cpu": name, "memory": name}}],
    }


def test_admitted_job_pods_carry_their_flavors_labels_and_tolerations_and_wait_for_an_unread_one() -> None:
    from finetune_operator.kueue import admitted_flavors

    tol = {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    w = World(job2(queueName="q"))
    w.step()
    w.kueue(*ADMITTED, admission=on_flavor("spr"))
    assert admitted_flavors(w.workload) == ["spr"]
    p = w.step()  # the flavor could not be read (Observed.flavors lacks it): nothing is created yet
    assert p.create == [] and w.phase == "Pending" and w.job["status"]["reason"] == "FlavorNotFound"
    assert "ResourceFlavor(s) spr" in w.job["status"]["message"]
    w.flavors = {"spr": {"metadata": {"name": "spr"}, "spec": {"nodeLabels": {"pool": "spr"}, "tolerations": [tol]}}}
    p = w.step()
    pods = [o for o in p.create if o["kind"] == "Pod"]
    assert len(pods) == 2 and all(o["spec"]["nodeSelector"]["pool"] == "spr" for o in pods)
    assert all(tol in o["spec"]["tolerations"] for o in pods)
    # A group restart's pods are placed by the same admission.
    w.all_phase("Running")
    w.step()
    w.set_phase("j-rank-1", "Failed", **terminated(1))
    w.step()
    w.gone()
    p = w.step()
    assert [o["spec"]["nodeSelector"]["pool"] for o in p.create if o["kind"] == "Pod"] == ["spr", "spr"]
    # An evicted Workload's flavors are not read.
    w.kueue(("Evicted", "True", "Preempted", "Preempted"))
    assert admitted_flavors(w.workload) == []


def test_a_flavor_contradicting_the_jobs_node_selector_fails_it_and_releases_the_quota() -> None:
    w = World(
        make_job("j", "ns")
        .nodes(2)
        .classification()
        .set("spec.hardware.nodeSelector", {"pool": "trn1"})
        .run_policy(queueName="q")
        .build()
    )
    w.step()
    w.flavors = {"spr": {"metadata": {"name": "spr"}, "spec": {"nodeLabels": {"pool": "spr"}}}}
    w.kueue(*ADMITTED, admission=on_flavor("spr"))
    p = w.step()
    assert not [o for o in p.create if o["kind"] == "Pod"] and not w.pods
    assert w.phase == "Failed" and w.job["status"]["reason"] == "FlavorConflict"
    msg = w.job["status"]["message"]
    assert "spec.hardware.nodeSelector sets pool=trn1" in msg
    assert "ResourceFlavor(s) spr with nodeLabels pool=spr" in msg
    assert "Fix:" in msg
    assert p.workload_status is not None
    finished = [c for c in p.workload_status["status"]["conditions"] if c["type"] == "Finished"]
    assert finished and finished[0]["status"] == "True"


def test_a_flavor_edited_under_running_pods_fails_the_job_only_when_it_creates_pods() -> None:
    w = World(
        make_job("j", "ns")
        .nodes(2)
        .classification()
        .set("spec.hardware.nodeSelector", {"pool": "spr"})
        .run_policy(queueName="q", backoffLimit=2)
        .build()
    )
    w.step()
    w.flavors = {"spr": {"metadata": {"name": "spr"}, "spec": {"nodeLabels": {"pool": "spr"}}}}
    w.kueue(*ADMITTED, admission=on_flavor("spr"))
    w.step()
    w.all_phase("Running")
    w.step()
    assert w.phase == "Running"
    w.flavors["spr"]["spec"]["nodeLabels"] = {"pool": "other"}  # edited after the pods started
    w.step()
    assert w.phase == "Running" and not [n for n, p in w.pods.items() if p["metadata"].get("deletionTimestamp")]
    w.set_phase("j-rank-1", "Failed", **terminated(1))
    w.step()
    assert w.phase == "Restarting"
    w.gone()
    p = w.step()  # the restart's pods would go where the job did not ask: the job fails instead
    assert p.create == [] and w.phase == "Failed" and w.job["status"]["reason"] == "FlavorConflict"


def test_a_workload_the_job_does_not_control_is_never_its_admission() -> None:
    w = World(job2(queueName="q"))
    w.step()
    assert w.workload is not None
    w.workload["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-older-job"
    w.kueue(*ADMITTED, admission=True)
    p = w.step()
    assert p.create == [] and not w.pods and p.workload_status is None
    assert w.phase == "Queued" and w.job["status"]["reason"] == "ForeignWorkload"
    assert "not controlled by this job" in w.job["status"]["message"]


def test_worker_oom_seen_with_the_launchers_crash_is_reported_as_the_oom() -> None:
    """Kubeflow's MPIJob complaint: a worker killed for memory shows as the launcher's crash (mpirun exits 1 once
    its ssh to the worker drops). Seen in the same pass, the worker's OOMKilled is the failure reported."""
    w = World(load_sample("cpu-distilbert-squad-mpi"))
    w.job["spec"].setdefault("runPolicy", {})["backoffLimit"] = 0
    w.step()
    w.all_phase("Running")
    w.step()
    w.set_phase(
        "distilbert-squad-cpu-worker-1",
        "Failed",
        containerStatuses=[{"name": "sshd", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
    )
    w.set_phase(
        "distilbert-squad-cpu-launcher",
        "Failed",
        containerStatuses=[
            {
                "name": "launcher",
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "mpirun: ssh connection lost"}},
            }
        ],
    )
    w.step()
    st = w.job["status"]
    assert w.phase == "Failed" and st["reason"] == "OOMKilled", st["message"]
    assert st["failures"][-1]["pod"] == "distilbert-squad-cpu-worker-1"
    assert st["message"].startswith("rank 1 (pod distilbert-squad-cpu-worker-1) failed: OOMKilled")


def test_slim_pods_plan_as_whole_pods_do() -> None:
    """The pod index holds `slim_child` of each pod: every state reconcile tells apart plans the same from it."""
    from finetune_operator.reconcile import slim_child

    w = World(make_job("slim").nodes(2).classification().build())
    w.step()
    base = {name: copy.deepcopy(pod) for name, pod in w.pods.items()}
    for pod in base.values():  # what a real pod body carries besides: spec, managed fields, other conditions
        pod["metadata"].update(uid="u", resourceVersion="7", managedFields=[{"manager": "kubelet"}])
        pod["status"].update(podIP="10.0.0.1", hostIP="10.0.0.2", startTime="2026-12-02T10:00:00Z")
    terminated = {"exitCode": 137, "reason": "OOMKilled", "message": "last lines", "containerID": "c://1"}
    states: list[dict[str, Any]] = [
        {
            "phase": "Running",
            "containerStatuses": [
                {"name": "trainer", "ready": True, "state": {"running": {"startedAt": "2026-12-02T10:00:01Z"}}}
            ],
        },
        {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]},
        {"phase": "Failed", "reason": "Evicted", "message": "node low on memory"},
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"},
                {"type": "Ready", "status": "False"},
            ],
        },
        {"phase": "Pending", "initContainerStatuses": [{"name": "precompile", "state": {"running": {}}}]},
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "x",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ],
        },
        {"phase": "Succeeded"},
    ]
    for state in states:
        for deleting in (False, True):
            pods = copy.deepcopy(base)
            first = pods["slim-rank-1"]
            first["status"] = dict(first["status"], **copy.deepcopy(state))
            if deleting:
                first["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:05Z"
            whole = reconcile(
                copy.deepcopy(w.job), Observed(list(pods.values()), dict(w.objects), w.now, None, lambda: KEYS)
            )
            slim = reconcile(
                copy.deepcopy(w.job),
                Observed([slim_child(p) for p in pods.values()], dict(w.objects), w.now, None, lambda: KEYS),
            )
            assert (slim.status, slim.create, slim.delete_pods, slim.events) == (
                whole.status,
                whole.create,
                whole.delete_pods,
                whole.events,
            ), (state, deleting)


READY = {"conditions": [{"type": "Ready", "status": "True"}]}


def pods_ready(w: World, plan: Plan) -> dict[str, Any] | None:
    """The PodsReady condition the plan writes on the Workload (applied, as the API server would), or None."""
    if plan.workload_status is None:
        return None
    assert w.workload is not None
    w.workload["status"].update(copy.deepcopy(plan.workload_status["status"]))
    return next((c for c in plan.workload_status["status"]["conditions"] if c["type"] == "PodsReady"), None)


def test_an_admitted_workload_is_pods_ready_once_every_pod_is_and_again_after_a_restart() -> None:
    """Kueue's waitForPodsReady evicts an admitted Workload that is not PodsReady=True in time: the job sets it
    as Kueue's own integrations do (reasons Started, WaitForRecovery, Recovered)."""
    w = World(job2(queueName="q", backoffLimit=1))
    w.step()
    w.kueue(*ADMITTED, admission=True)
    assert pods_ready(w, w.step()) is None  # no pods yet: no condition counts as WaitForStart
    w.set_phase("j-rank-0", "Running", **READY)
    w.set_phase("j-rank-1", "Running")  # its containers run, not ready yet
    assert pods_ready(w, w.step()) is None
    w.set_phase("j-rank-1", "Running", **READY)
    cond = pods_ready(w, w.step())
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Started")
    assert cond["message"] == "All pods reached readiness and the workload is running"
    assert w.step().workload_status is None  # unchanged: nothing written
    w.set_phase("j-rank-0", "Failed", **terminated(1))
    cond = pods_ready(w, w.step())  # the group restart
    assert w.phase == "Restarting" and cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "WaitForRecovery") and "attempt 1" in cond["message"]
    w.gone()
    w.step()
    w.all_phase("Running")
    for name in w.pods:
        w.set_phase(name, "Running", **READY)
    cond = pods_ready(w, w.step())
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Recovered")
    w.all_phase("Succeeded")
    p = w.step()
    assert w.phase == "Succeeded" and {c["type"] for c in p.workload_status["status"]["conditions"]} >= {"Finished"}  # type: ignore[index]


def test_pods_ready_is_taken_back_when_kueue_evicts_the_job() -> None:
    w = World(job2(queueName="q"))
    w.step()
    w.kueue(*ADMITTED, admission=True)
    w.step()
    for name in list(w.pods):
        w.set_phase(name, "Running", **READY)
    assert pods_ready(w, w.step()) is not None
    w.kueue(("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    p = w.step()
    cond = pods_ready(w, p)
    assert w.phase == "Queued" and cond is not None and (cond["status"], cond["reason"]) == ("False", "WaitForStart")


def test_a_removed_queue_name_deletes_the_jobs_own_workload_and_no_other() -> None:
    w = World(job2(queueName="q"))
    w.step()
    assert w.workload is not None and not w.pods
    w.workload["metadata"]["uid"] = "wl-uid"
    del w.job["spec"]["runPolicy"]["queueName"]
    p = w.step()
    assert p.delete_workload == "wl-uid"  # with that uid as the delete's precondition
    assert sorted(o["kind"] for o in p.create) == ["ConfigMap", "Pod", "Pod", "Service"]  # it runs unqueued
    w.workload["metadata"]["ownerReferences"][0]["uid"] = "another-job"
    assert w.step().delete_workload is None


def test_a_queue_name_changed_while_queued_replaces_the_workload_in_the_new_queue() -> None:
    """Admission lets queueName change only while the job waits in its queue; the Workload that waits is in the
    old queue, so it goes (by uid) and the next pass makes one in the new queue, which Kueue admits from there."""
    w = World(job2(queueName="small"))
    w.step()
    w.kueue(PENDING)
    assert w.workload is not None
    w.workload["metadata"]["uid"] = "wl-small"
    w.job["spec"]["runPolicy"]["queueName"] = "big"
    p = w.step()
    assert p.delete_workload == "wl-small" and p.create == [] and not w.pods
    assert w.phase == "Queued" and "moving from LocalQueue small to big" in w.job["status"]["message"]
    w.workload = None  # the delete went through
    p = w.step()
    assert [o["kind"] for o in p.create] == ["Workload"] and w.workload["spec"]["queueName"] == "big"
    w.kueue(*ADMITTED, admission=True)
    assert sorted(o["kind"] for o in w.step().create) == ["ConfigMap", "Pod", "Pod", "Service"]


def test_an_admitted_workload_is_never_moved_to_another_queue() -> None:
    """Once admitted, the job keeps its Workload whatever queueName says (admission refuses that change; a job
    stored otherwise must not lose its running pods to a requeue)."""
    w = World(job2(queueName="small"))
    w.step()
    w.kueue(*ADMITTED, admission=True)
    w.step()
    w.job["spec"]["runPolicy"]["queueName"] = "big"
    p = w.step()
    assert p.delete_workload is None and not p.delete_pods


def test_deletes_name_the_uid_of_the_pod_they_mean() -> None:
    w = World(job2())
    w.step()
    for name, pod in w.pods.items():
        pod["metadata"]["uid"] = f"uid-{name}"
    w.set_phase("j-rank-0", "Failed", **terminated(1))
    p = w.step()
    assert p.pod_uids == {"j-rank-0": "uid-j-rank-0", "j-rank-1": "uid-j-rank-1"}


def test_the_workload_index_keeps_the_queue_the_workload_waits_in() -> None:
    from finetune_operator.reconcile import slim_workload

    body = {"kind": "Workload", "metadata": {"name": "j"}, "spec": {"queueName": "q", "podSets": [{"count": 2}]}}
    assert slim_workload(body)["spec"] == {"queueName": "q"}
