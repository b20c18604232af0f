"""Names shared by the API, builders, reconcile and handlers. Each says who reads it."""

from typing import Final

# The CRD identity: read by the CRD generator, the kopf handlers, the API wrapper and `ftjob render`.
GROUP: Final = "finetune.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "FineTuneJob"
PLURAL: Final = "finetunejobs"
SINGULAR: Final = "finetunejob"
SHORT_NAMES: Final = ("ftj",)

# Labels on every child. The operator watches its children by MANAGED_BY and indexes them by JOB_NAME; the
# chart's NetworkPolicy selects by MANAGED_BY.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
MANAGED_BY: Final = "finetune-operator"
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_ROLE: Final = f"{GROUP}/role"  # rank | worker | launcher
LABEL_RANK: Final = f"{GROUP}/rank"  # pod index among rank-holding pods
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"  # restartCount the pod was created for; older ones are torn down

# Kueue (spec.runPolicy.queueName): the operator creates one Workload per job (builders/workload.py), named
# like the job, and creates pods only while it is admitted (kueue.queued). Read by the builder, k8s.py
# and the chart's RBAC. The queue-name label is also set on the Workload, as Kueue's own integrations do.
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
KUEUE_WORKLOADS: Final = "workloads"
# Cluster-scoped; read (get) for an admitted job's assigned flavors, whose nodeLabels and tolerations go onto
# its pods (builders/flavors.py).
KUEUE_RESOURCE_FLAVORS: Final = "resourceflavors"
LABEL_KUEUE_QUEUE: Final = "kueue.x-k8s.io/queue-name"

# Roles of child pods (LABEL_ROLE values).
ROLE_RANK: Final = "rank"  # torchrun pods: each runs torchrun for its node rank
ROLE_WORKER: Final = "worker"  # MPI worker pods: sshd, ranks are spawned into them by mpirun
ROLE_LAUNCHER: Final = "launcher"  # MPI launcher pod: runs mpirun

# In-pod paths and ports: the contract with the runtime (docs/architecture.md).
CONFIG_DIR: Final = "/etc/ftjob"
CONFIG_FILE: Final = f"{CONFIG_DIR}/config.json"
HOSTFILE: Final = f"{CONFIG_DIR}/hostfile"
SSH_DIR: Final = f"{CONFIG_DIR}/ssh"
CACHE_DIR: Final = "/cache"
OUTPUT_DIR: Final = "/output"
RESUME_FROM_DIR: Final = "/resume-from"  # a pvc:// output.resumeFrom, read-only (builders.pods, builders.env)
HOME_DIR: Final = "/home/ftjob"
MASTER_PORT: Final = 29500  # torch.distributed rendezvous (torchrun --master-port)
SSH_PORT: Final = 2222  # sshd of MPI workers; >1024 because the images run it as non-root
# Keys of the {job}-ssh Secret each MPI role mounts (builders.pods, as Secret volume items; the runtime's
# sshd.install_keys copies them): the launcher is the ssh client, the workers are the servers. Workers never hold
# the client's private key, the launcher never holds the host's.
SSH_LAUNCHER_KEYS: Final = ("id_ed25519", "id_ed25519.pub", "known_hosts")
SSH_WORKER_KEYS: Final = ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "authorized_keys")
NEURON_RT_COMM_PORT: Final = 46820  # NEURON_RT_ROOT_COMM_ID port on rank 0; reserved for the Neuron runtime
PROGRESS_PREFIX: Final = "FTJOB_PROGRESS "  # runtime's structured progress lines (parsed by progress.py)

# Container names: reconcile reads their statuses, tests assert on them.
CONTAINER_TRAINER: Final = "trainer"
CONTAINER_LAUNCHER: Final = "launcher"
CONTAINER_SSHD: Final = "sshd"
INIT_WAIT: Final = "wait-for-peers"
INIT_PRECOMPILE: Final = "precompile"

# The taints the node lifecycle controller puts on a node it declares lost (NoExecute: pods are evicted once their
# toleration ends, 300 s by default). Read by the rule that runPolicy.nodeLossSeconds ends before a toleration of
# them does (api/rules.py).
NODE_LOSS_TAINTS: Final = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")

RUNTIME_CMD: Final = "ftjob-runtime"  # console script of the runtime package, present in every image

# Leader election (leader.py): controller-runtime's defaults, read by `ftjob operator`'s --leader-elect-* flags
# (cli.py) and leader.Timing; the chart's leaderElection values default to the same.
LEASE_DURATION_S: Final = 15.0
RENEW_DEADLINE_S: Final = 10.0
RETRY_PERIOD_S: Final = 2.0
LEASE_NAME: Final = "finetune-operator"  # --leader-elect-resource-name; the chart passes the release's full name

# Seconds the rest of a failed group gets to end (a deletion's gracePeriodSeconds) instead of the pods' own
# terminationGracePeriodSeconds, which is sized for a checkpoint: a group that lost a rank, its node or its progress
# cannot save one (every rank takes part in a save), and waiting for its hung collectives would only delay the
# restart, or keep a Failed job's nodes. reconcile applies it; the schema's description of the field states it.
FAILED_GROUP_GRACE_S: Final = 10
