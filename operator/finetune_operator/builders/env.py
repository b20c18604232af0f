"""Container environment: the runtime contract (docs/architecture.md) plus what the profile derives.

Order matters: later layers win, and the user's spec.env wins over everything.
"""

from __future__ import annotations

from typing import Any

from .. import constants as c
from ..api.schema import COMPILE_CACHE
from .layout import Layout
from .names import Names
from .objects import job_uid


def output_location(job: dict[str, Any], names: Names) -> str | None:
    """The job's own location, which its pods write to and status.output.location reports: the claim's job
    directory (`names.output_sub_path`, mounted at /output) or `<output.url>/<namespace>/<job>/`. Jobs sharing a
    claim or a URL each get their own; a job re-created under the same name gets its predecessor's, inside which
    the runtime keeps to what carries the job's uid (docs/runtime.md)."""
    output = job["spec"].get("output") or {}
    if output.get("url"):
        return f"{output['url'].rstrip('/')}/{names.namespace}/{names.job}/"
    if output.get("claimName"):
        return f"pvc://{output['claimName']}/{names.output_sub_path(output.get('path'))}/"
    return None


def resume_from(output: dict[str, Any]) -> str | None:
    """FTJOB_RESUME_FROM: output.resumeFrom as the pods reach it (an s3:// URL as given; a pvc:// directory is
    mounted read-only at RESUME_FROM_DIR, pods.py)."""
    src = str(output.get("resumeFrom") or "")
    if not src:
        return None
    return src if src.startswith("s3://") else c.RESUME_FROM_DIR


def resume_from_sub_path(output: dict[str, Any]) -> str | None:
    """The claim directory a pvc://<claim>/<dir> resumeFrom names ("" for the claim's root)."""
    src = str(output.get("resumeFrom") or "")
    if not src.startswith("pvc://"):
        return None
    return src[len("pvc://") :].partition("/")[2].strip("/")


# The schema's default (one home: api/schema.py); admission has applied it whenever spec.compileCache is given.
PRECOMPILE_STEPS_DEFAULT = COMPILE_CACHE["properties"]["precompileSteps"]["default"]


def thread_env(layout: Layout) -> dict[str, str]:
    """OMP/oneCCL thread counts from the pod's CPUs (never from the host that renders them); a stack with oneCCL
    gives each rank's progress threads their own cores."""
    p = layout.profile
    env: dict[str, str] = {}
    if p.threads is None or layout.cpu_per_pod is None:
        return env
    cores = int(layout.cpu_per_pod) // p.threads.threads_per_core
    per_proc = max(1, cores // layout.procs_per_node)
    ccl = layout.stack.ccl_worker_count
    env["OMP_NUM_THREADS"] = str(max(1, per_proc - ccl))
    if ccl:
        env["CCL_WORKER_COUNT"] = str(ccl)
    if p.threads.tcmalloc:
        env["LD_PRELOAD"] = p.threads.tcmalloc
    return env


def derived_env(job: dict[str, Any], layout: Layout, names: Names) -> dict[str, str]:
    """Every variable the operator sets for the job's containers, before spec.env."""
    spec = job["spec"]
    p = layout.profile
    stack = layout.stack
    training = spec.get("training") or {}
    cache = spec.get("compileCache") or {}
    output = spec.get("output") or {}
    env: dict[str, str] = {}
    env.update(p.env)
    env.update(stack.env)
    env.update(thread_env(layout))
    if training.get("precision") == "bf16":
        env.update(stack.bf16_env)
    if layout.nodes > 1:
        env.update(p.multi_node_env)
    if layout.efa and p.efa:
        env.update(p.efa.env)
    if stack.compile_cache:
        # spec.compileCache.url only where the stack's cache takes one (admission's cache-url-stack rule)
        env[stack.compile_cache.variable] = cache.get("url") or f"{c.CACHE_DIR}/{stack.compile_cache.directory}"
    if p.backend == "neuron" and layout.nodes > 1:
        env["NEURON_RT_ROOT_COMM_ID"] = f"{names.master_addr}:{c.NEURON_RT_COMM_PORT}"
    env.update(
        {
            "FTJOB_JOB_NAME": names.job,
            "FTJOB_NAMESPACE": names.namespace,
            # Checkpoints record it, and a job resumes only from its own (a re-created job starts fresh).
            "FTJOB_JOB_UID": job_uid(job),
            "FTJOB_CONFIG": c.CONFIG_FILE,
            "FTJOB_PROFILE": p.name,
            "FTJOB_BACKEND": stack.backend,
            "FTJOB_LAUNCHER": layout.launcher,
            "FTJOB_NNODES": str(layout.nodes),
            "FTJOB_NPROC_PER_NODE": str(layout.procs_per_node),
            "FTJOB_WORLD_SIZE": str(layout.world_size),
            "FTJOB_MASTER_ADDR": names.master_addr,
            "FTJOB_MASTER_PORT": str(c.MASTER_PORT),
            "FTJOB_CACHE_DIR": c.CACHE_DIR,
            "FTJOB_OUTPUT_DIR": c.OUTPUT_DIR,  # the job's own directory of the claim (names.output_sub_path)
            "FTJOB_PRECOMPILE_STEPS": str(cache.get("precompileSteps", PRECOMPILE_STEPS_DEFAULT)),
            "HF_HOME": f"{c.CACHE_DIR}/hf",
            "HOME": c.HOME_DIR,
        }
    )
    grace = (spec.get("runPolicy") or {}).get("terminationGracePeriodSeconds")
    if grace is not None:
        # The pods' grace period: torchrun gives its workers this long to save after a SIGTERM (launcher.py).
        env["FTJOB_TERMINATION_GRACE_SECONDS"] = str(grace)
    location = output_location(job, names)
    if output.get("url") and location:
        env["FTJOB_OUTPUT_URL"] = location
    source = resume_from(output)
    if source:
        env["FTJOB_RESUME_FROM"] = source
    if layout.launcher == "mpi":
        env.update(
            {
                "FTJOB_MPI_IMPLEMENTATION": str(layout.mpi_implementation),
                "FTJOB_HOSTFILE": c.HOSTFILE,
                "FTJOB_MPI_SLOTS_PER_NODE": str(layout.procs_per_node),
                "FTJOB_SSH_PORT": str(c.SSH_PORT),
                # Hydra's proxies on the workers dial mpiexec back by this name; its default, the launcher's
                # short hostname, does not resolve in the workers' pods (found by the e2e tier).
                "FTJOB_LAUNCHER_HOST": names.fqdn(names.launcher),
            }
        )
    return env


def command_env(nodes: int, procs_per_node: int, master_addr: str, master_port: int, node_rank: int) -> dict[str, str]:
    """What a bring-your-own command (spec.command) in torchrun pod `node_rank` gets besides the contract.

    The plain names (MASTER_ADDR, NNODES, ...) are for scripts that read them; the PET_* names are torchrun's
    own defaults for its --nnodes, --nproc-per-node, --node-rank, --master-addr and --master-port (Kubeflow's
    PyTorchJob sets them too), so a bare `torchrun train.py` joins one world across the pods instead of
    training a separate copy in each. Pods and `ftjob run` (local.py, with local addresses) both use this."""
    layout_env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "NNODES": str(nodes),
        "NODE_RANK": str(node_rank),
        "NPROC_PER_NODE": str(procs_per_node),
    }
    pet = {f"PET_{k}": v for k, v in layout_env.items()}
    return {**layout_env, **pet}


def container_env(
    job: dict[str, Any], layout: Layout, names: Names, extra: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The env list of a container: derived values, `extra` (per pod), the HF token, then spec.env."""
    spec = job["spec"]
    merged = derived_env(job, layout, names)
    merged.update(extra or {})
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in merged.items()]
    token = spec.get("hfTokenSecretRef")
    if token:
        out.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token["name"], "key": token.get("key", "token")}},
            }
        )
    user = spec.get("env") or []
    user_names = {e["name"] for e in user}
    return [e for e in out if e["name"] not in user_names] + list(user)
