"""OpenAPI v3 schema of FineTuneJob: the single source of truth.

The CRD (and so `kubectl explain`), `ftjob render`'s structural validation and the docs are all generated from
this module. Cross-field rules live in `rules.py` next to their CEL twins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Schema = dict[str, Any]

# The hardware profiles are the files profiles/<name>.yaml, and nothing else: adding a file adds the profile to
# the CRD's enum, the chart's values schema (`make generate`) and every list derived from this one. Read as data
# by file name, not imported: the profiles package imports this module.
PROFILES = tuple(sorted(f.stem for f in (Path(__file__).resolve().parents[1] / "profiles").glob("*.yaml")))
LAUNCHERS = ("torchrun", "mpi")
MPI_IMPLEMENTATIONS = ("intel", "mpich", "openmpi")
TASK_TYPES = ("text-classification", "question-answering")
PRECISIONS = ("fp32", "bf16")
CLEAN_POD_POLICIES = ("Running", "All")
PHASES = ("Queued", "Pending", "Precompiling", "Running", "Restarting", "Suspended", "Succeeded", "Failed")

# DNS-1123 label; job names end up in pod hostnames ("{job}-worker-{i}"), hence the tighter length bound
# applied on metadata.name by a CEL rule in the CRD.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _s(description: str, **kw: Any) -> Schema:
    return {"type": "string", "description": description, **kw}


def _i(description: str, **kw: Any) -> Schema:
    return {"type": "integer", "description": description, **kw}


def _n(description: str, **kw: Any) -> Schema:
    return {"type": "number", "description": description, **kw}


def _b(description: str, **kw: Any) -> Schema:
    return {"type": "boolean", "description": description, **kw}


def _o(description: str, properties: dict[str, Schema], **kw: Any) -> Schema:
    return {"type": "object", "description": description, "properties": properties, **kw}


def _free(description: str) -> Schema:
    """An object passed through to Kubernetes unchanged (validated by the API server when the pod is made)."""
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def _strmap(description: str, max_props: int = 64) -> Schema:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string", "maxLength": 1024},
        "maxProperties": max_props,
    }


def _strlist(description: str, max_items: int = 256, **kw: Any) -> Schema:
    return {
        "type": "array",
        "description": description,
        "items": {"type": "string", "maxLength": 4096},
        "maxItems": max_items,
        **kw,
    }


def _free_list(description: str, max_items: int = 64) -> Schema:
    return {
        "type": "array",
        "description": description,
        "maxItems": max_items,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }


HARDWARE = _o(
    "Where and how wide the job runs. Immutable after creation.",
    {
        "profile": _s(
            "Hardware profile: trn1 and trn2 (AWS Trainium, Neuron SDK), xeon-amx (Intel Sapphire Rapids or newer "
            "with AMX, oneCCL over MPI), cpu (any x86 CPU, gloo), nvidia (CUDA GPUs, NCCL). Selects device-plugin "
            "resources, tolerations, node selectors, launcher and environment.",
            enum=list(PROFILES),
        ),
        "instanceType": _s(
            "EC2 instance type of the nodes, e.g. trn1.32xlarge or m7i.metal-48xl. Determines devices, cores, vCPUs, "
            "memory and EFA interfaces; pods are pinned to it by node.kubernetes.io/instance-type. Optional: each "
            "profile has a default (cpu: none, sized from resources).",
            maxLength=63,
        ),
        "nodes": _i("Number of pods that hold ranks (one per node).", minimum=1, maximum=1024, default=1),
        "procsPerNode": _i(
            "Training processes per pod. Derived when absent: one per requested NeuronCore (Trainium), one per "
            "socket (Xeon), one per GPU (nvidia), 1 (cpu). On trn1 a request of more than one device must be "
            "1, 4, 8 or 16 devices (what the Neuron scheduler can place).",
            minimum=1,
            maximum=256,
        ),
        "schedulerName": _s(
            "Scheduler for the rank pods, e.g. the Neuron scheduler extension's scheduler ('my-scheduler' in the "
            "Neuron docs) which keeps NeuronCore IDs contiguous. Default: the cluster's default scheduler.",
            maxLength=253,
        ),
        "resources": _o(
            "Per-pod requests/limits that replace the derived ones (keys as in a container's resources).",
            {
                "requests": _strmap("Resource requests, e.g. {cpu: '8', memory: 32Gi}."),
                "limits": _strmap("Resource limits."),
            },
        ),
        "nodeSelector": _strmap("Node labels, merged over the profile's (yours win)."),
        "tolerations": _free_list("Tolerations, added to the profile's (e.g. aws.amazon.com/neuron)."),
        "affinity": _free("Pod affinity; replaces the profile's when given."),
    },
    required=["profile"],
)

MPI = _o(
    "MPI launch settings; only with launcher: mpi.",
    {
        "implementation": _s(
            "MPI implementation in the image. intel and mpich read 'host:N' hostfiles (Hydra), openmpi "
            "'host slots=N'. Default from the profile: intel on xeon-amx, mpich elsewhere (the cpu image's).",
            enum=list(MPI_IMPLEMENTATIONS),
        ),
        "slotsPerNode": _i(
            "Ranks per worker pod (mpirun -ppn). Defaults to the derived processes per node.",
            minimum=1,
            maximum=256,
        ),
    },
)

# Suffixes `format` is told from when absent (read by rules.py's data-files-format rule and the runtime's
# finetune_runtime.data.data_files_format); a compression suffix may follow.
DATA_FILE_FORMATS = ("json", "csv", "parquet")
DATA_FILE_SUFFIXES = {"json": ("jsonl", "json"), "csv": ("csv",), "parquet": ("parquet",)}
DATA_FILE_COMPRESSIONS = ("gz", "bz2", "xz", "zst")

DATASET = _o(
    "Training data, from exactly one source: name (a Hugging Face hub dataset with a loader datasets can run), "
    "dataFiles (data files per split: hf://datasets/..., local paths, or other fsspec URLs), or path (a file or "
    "directory inside the image or on a mounted volume; jsonl, json, csv, parquet).",
    {
        "name": _s("Hugging Face hub dataset, e.g. squad. Datasets that only ship a legacy loading script (e.g. "
                   "mteb/amazon_reviews_multi) do not load by name with datasets 4 or newer: use dataFiles.",
                   maxLength=256),
        "config": _s("Dataset configuration of a hub dataset (with name), e.g. plain_text.", maxLength=128),
        "dataFiles": {
            "type": "object",
            "description": "Data files by split name, loaded with datasets.load_dataset(format, data_files=...), "
            "e.g. {train: hf://datasets/mteb/amazon_reviews_multi/ja/train.jsonl, validation: "
            "hf://datasets/mteb/amazon_reviews_multi/ja/validation.jsonl}. Each value is one file, URL or glob "
            "pattern: hf://datasets/<owner>/<name>/<file> (a token from hfTokenSecretRef is used for gated or "
            "private repositories), a local path (relative to the working directory), or another fsspec URL "
            "such as s3://bucket/key when the image has that protocol's package (s3fs is not in the shipped "
            "images). Must contain trainSplit (and evalSplit when set). Records, not SQuAD's nested JSON: use "
            "path for that.",
            "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 1024},
            "minProperties": 1,
            "maxProperties": 16,
        },
        "format": _s(
            "Format of the dataFiles: json (JSON lines or a JSON array of records), csv or parquet. Default: told "
            "from the files' extension (.jsonl/.json, .csv, .parquet, optionally compressed .gz/.bz2/.xz/.zst), "
            "which must then be the same for every split.",
            enum=list(DATA_FILE_FORMATS),
        ),
        "path": _s("Local file or directory; relative paths are relative to the working directory. In a "
                   "directory, each file's name up to the first '.' or '-' is its split (train.jsonl -> train).",
                   maxLength=1024),
        "trainSplit": _s("Split to train on.", maxLength=64, default="train"),
        "evalSplit": _s(
            "Split to evaluate on (the runtime's default: validation). When the dataset has no split of that name, "
            "a seeded slice of the train split is held out instead: evalSamples rows, else a tenth.",
            maxLength=64,
        ),
        "textColumn": _s("Column with the text (text-classification).", maxLength=128),
        "textPairColumn": _s("Optional second text column (sentence pairs).", maxLength=128),
        "labelColumn": _s("Column with the label (text-classification).", maxLength=128),
        "labelMap": {
            "type": "object",
            "description": "Maps raw label values (as strings) to class ids. Rows whose label is not a key are "
            "dropped, e.g. {'0': 0, '1': 0, '3': 1, '4': 1} on mteb/amazon_reviews_multi (label = stars - 1) "
            "makes 1-2 stars negative, 4-5 positive and drops 3 stars.",
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 1023},
            "maxProperties": 1024,
        },
        "questionColumn": _s("Question column (question-answering).", maxLength=128, default="question"),
        "contextColumn": _s("Context column (question-answering).", maxLength=128, default="context"),
        "answersColumn": _s("SQuAD-style answers column (question-answering).", maxLength=128, default="answers"),
        "trainSamples": _i("Train on this many rows, taken after label mapping from the split shuffled with "
                           "training.seed (so files sorted by label still give every class).", minimum=1),
        "evalSamples": _i("Evaluate on this many rows, taken the same way from the evaluation split.", minimum=1),
    },
)

TASK = _o(
    "Built-in fine-tuning task run by the runtime in the image. Mutually exclusive with command. Immutable.",
    {
        "type": _s("What to fine-tune for.", enum=list(TASK_TYPES)),
        "model": _s(
            "Hugging Face model name or a directory with a model, e.g. "
            "cl-tohoku/bert-base-japanese-whole-word-masking or distilbert-base-uncased.",
            minLength=1,
            maxLength=512,
        ),
        "tokenizer": _s("Tokenizer name or directory when it differs from model.", maxLength=512),
        "dataset": DATASET,
        "maxLength": _i("Maximum tokens per example.", minimum=8, maximum=8192, default=128),
        "docStride": _i(
            "Overlap between windows of long contexts (question-answering).", minimum=1, maximum=4096, default=128
        ),
        "labels": _strlist("Class names by id, e.g. [negative, positive]; saved in the model config.", 1024),
        "inferenceSamples": _strlist("Sentences for the inference check run on the saved model.", 64),
    },
    required=["type", "model", "dataset"],
)

TRAINING = _o(
    "Hyper-parameters for the built-in task.",
    {
        "epochs": _n("Training epochs.", minimum=0, exclusiveMinimum=True, maximum=10000, default=3),
        "maxSteps": _i("Stop after this many optimizer steps (overrides epochs).", minimum=1),
        "learningRate": _n("Peak learning rate.", minimum=0, exclusiveMinimum=True, maximum=1, default=5e-5),
        "batchSizePerDevice": _i("Examples per process per step.", minimum=1, maximum=4096, default=8),
        "gradientAccumulationSteps": _i("Steps accumulated per optimizer step.", minimum=1, default=1),
        "precision": _s(
            "fp32, or bf16 (Neuron: model cast to bf16 with stochastic rounding; Xeon: autocast on AMX; nvidia: "
            "autocast).",
            enum=list(PRECISIONS),
            default="fp32",
        ),
        "seed": _i("Random seed for sampling, initialisation and shuffling.", minimum=0, default=42),
        "checkpointEverySteps": _i(
            "Save a checkpoint to the output every N steps (and at each epoch end); restarts resume from the "
            "newest complete one.",
            minimum=1,
            default=500,
        ),
        "logEverySteps": _i("Progress line every N steps.", minimum=1, default=10),
        "evalEverySteps": _i("Evaluate every N steps; default: at each epoch end.", minimum=1),
        "warmupRatio": _n("Fraction of steps for learning-rate warm-up.", minimum=0, maximum=1, default=0.0),
        "weightDecay": _n("AdamW weight decay.", minimum=0, maximum=1, default=0.0),
        "compile": _b("Train through torch.compile (CPU, Xeon, nvidia).", default=False),
    },
)

COMPILE_CACHE = _o(
    "Shared cache for compiled graphs (Neuron NEFFs, torch.compile) and tokenized datasets, reused across ranks "
    "and jobs.",
    {
        "claimName": _s("ReadWriteMany PersistentVolumeClaim mounted at /cache (EFS, FSx).", maxLength=253),
        "url": _s(
            "Neuron compile cache URL (s3://bucket/prefix); used instead of /cache/neuron. Without claimName "
            "/cache is an emptyDir.",
            maxLength=1024,
            pattern="^(s3://|/).+",
        ),
        "precompile": _b(
            "Fill the cache first with a short trial run (neuron_parallel_compile on Trainium, torch.compile "
            "warm-up elsewhere). The job shows phase Precompiling meanwhile.",
            default=False,
        ),
        "precompileSteps": _i("Steps of the precompile trial run.", minimum=1, maximum=10000, default=16),
    },
)

OUTPUT = _o(
    "Where checkpoints, the final model, metrics and predictions go: a claim (and sub-path) or an S3 URL.",
    {
        "claimName": _s("PersistentVolumeClaim mounted at /output (ReadWriteMany for multi-node).", maxLength=253),
        "path": _s("Directory under the claim.", maxLength=1024, pattern=r"^[^/].*$"),
        "url": _s("s3://bucket/prefix to upload the results to (pods need S3 credentials, e.g. IRSA).",
                  maxLength=1024, pattern="^s3://.+"),
    },
)

RUN_POLICY = _o(
    "Restarts, deadlines and clean-up.",
    {
        "backoffLimit": _i(
            "Group restarts after a rank fails before the job is Failed. A rank fails when its pod fails or when "
            "its running pod is deleted by someone else (eviction, node drain, kubectl delete). Every restart "
            "resumes from the newest checkpoint.",
            minimum=0,
            maximum=1000,
            default=3,
        ),
        "activeDeadlineSeconds": _i("Fail the job when it runs longer than this.", minimum=1),
        "ttlSecondsAfterFinished": _i(
            "Delete the job (and, through owner references, every child) this long after it finished.", minimum=0
        ),
        "cleanPodPolicy": _s(
            "Which pods to delete when the job finishes: Running (pods still running; finished ones stay for "
            "their logs) or All. A finished job never leaves a pod running.",
            enum=list(CLEAN_POD_POLICIES),
            default="Running",
        ),
        "suspend": _b("Delete the pods and keep the job; setting it back to false recreates them.", default=False),
        "queueName": _s(
            "Kueue LocalQueue in the job's namespace. The operator creates a Workload (named like the job) in "
            "that queue and creates the pods only once Kueue admits it; meanwhile the job is Queued with "
            "Kueue's reason. Needs Kueue with FineTuneJob.v1alpha1.finetune.dev in "
            "integrations.externalFrameworks (docs/operator.md).",
            maxLength=253,
        ),
    },
    default={},
)

ENV_VAR = {
    "type": "object",
    "description": "A container environment variable (as in a Pod).",
    "x-kubernetes-preserve-unknown-fields": True,
    "required": ["name"],
    "properties": {"name": _s("Variable name.", minLength=1, maxLength=256)},
}

SECRET_KEY_REF = _o(
    "Secret key holding a Hugging Face token (exported as HF_TOKEN) for gated models and datasets.",
    {"name": _s("Secret name.", maxLength=253), "key": _s("Key in the Secret.", maxLength=253, default="token")},
    required=["name"],
)

SPEC = _o(
    "Desired state of a fine-tuning job.",
    {
        "hardware": HARDWARE,
        "launcher": _s(
            "How ranks start: torchrun (one torchrun per pod) or mpi (an MPI launcher pod runs mpirun over SSH "
            "into worker pods). Default from the profile (trn1/trn2/cpu/nvidia: torchrun, xeon-amx: mpi). "
            "Immutable.",
            enum=list(LAUNCHERS),
        ),
        "mpi": MPI,
        "image": _s("Container image; default per profile from the operator's configuration.", maxLength=1024),
        "imagePullPolicy": _s("Image pull policy.", enum=["Always", "IfNotPresent", "Never"]),
        "serviceAccountName": _s("Service account for the pods (e.g. one with IRSA for S3).", maxLength=253),
        "task": TASK,
        "command": _strlist(
            "Bring-your-own command run in every rank pod (torchrun) or by mpirun (mpi) instead of the built-in "
            "task. The rank environment is injected; nothing else is assumed.",
            256,
            minItems=1,
        ),
        "training": TRAINING,
        "compileCache": COMPILE_CACHE,
        "output": OUTPUT,
        "env": {
            "type": "array",
            "description": "Extra environment for every container (wins over derived values).",
            "items": ENV_VAR,
            "maxItems": 128,
        },
        "envFrom": _free_list("ConfigMaps/Secrets whose keys become environment variables.", 32),
        "hfTokenSecretRef": SECRET_KEY_REF,
        "runPolicy": RUN_POLICY,
    },
    required=["hardware"],
)

CONDITION = _o(
    "A condition of the job.",
    {
        "type": _s("Queued, Created, Precompiling, Running, Restarting, Suspended, Succeeded, Failed."),
        "status": _s("True, False or Unknown.", enum=["True", "False", "Unknown"]),
        "reason": _s("One-word reason."),
        "message": _s("Human-readable detail."),
        "lastTransitionTime": _s("When status last changed.", format="date-time"),
    },
    required=["type", "status"],
)

STATUS = _o(
    "Observed state, written by the operator.",
    {
        "phase": _s("Lifecycle phase.", enum=list(PHASES)),
        "message": _s("Latest notable event or error, including reconcile errors."),
        "reason": _s("Machine-readable reason of the phase (e.g. RankFailed, DeadlineExceeded)."),
        "conditions": {"type": "array", "description": "Conditions.", "items": CONDITION, "maxItems": 16},
        "restartCount": _i("Group restarts so far."),
        "ranks": _o(
            "Rank pods.",
            {"ready": _i("Pods running or done."), "total": _i("Pods that hold ranks.")},
        ),
        "worldSize": _i("Training processes in total."),
        "startTime": _s("When the pods were first created (activeDeadlineSeconds counts from here).",
                        format="date-time"),
        "completionTime": _s("When the job finished.", format="date-time"),
        "observedGeneration": _i("Generation of the spec last reconciled."),
        "progress": _free("Latest progress reported by rank 0: step, totalSteps, epoch, loss, samplesPerSecond, "
                          "etaSeconds, metrics, summary."),
        "failures": {
            "type": "array",
            "description": "Most recent rank failures (newest last).",
            "maxItems": 10,
            "items": _o(
                "A failed rank pod.",
                {
                    "attempt": _i("restartCount when it failed."),
                    "pod": _s("Pod name."),
                    "rank": _i("Pod index."),
                    "exitCode": _i("Exit code of the failed container."),
                    "reason": _s("Container reason, e.g. Error or OOMKilled; Evicted for a pod the kubelet evicted; "
                                 "Deleted for a running pod deleted by someone else."),
                    "logTail": _s("Last log lines of the failed container."),
                },
            ),
        },
    },
)


def openapi_schema() -> Schema:
    """The full openAPIV3Schema of the CRD (without CEL rules; crd.py adds those)."""
    return {
        "type": "object",
        "description": "FineTuneJob fine-tunes a Hugging Face model on Trainium, Xeon, CPUs or NVIDIA GPUs.",
        "properties": {
            "apiVersion": {"type": "string", "description": "finetune.dev/v1alpha1"},
            "kind": {"type": "string", "description": "FineTuneJob"},
            "metadata": {"type": "object"},
            "spec": SPEC,
            "status": STATUS,
        },
        "required": ["spec"],
    }
