"""OpenAPI v3 schema of FineTuneJob: the single source of truth.

The CRD (and so `kubectl explain`), `ftjob render`'s structural validation and the docs are all generated from
this module. Cross-field rules live in `rules.py` next to their CEL twins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import constants as c
from . import formats as f

Schema = dict[str, Any]

# The hardware profiles are the files profiles/<name>.yaml, and nothing else: adding a file adds the profile to
# the CRD's enum, the chart's values schema (`make generate`) and every list derived from this one. Read as data
# by file name, not imported: the profiles package imports this module.
PROFILES = tuple(sorted(f.stem for f in (Path(__file__).resolve().parents[1] / "profiles").glob("*.yaml")))
LAUNCHERS = ("torchrun", "mpi")
MPI_IMPLEMENTATIONS = ("intel", "mpich", "openmpi")
# One per runtime task plugin (runtime/finetune_runtime/tasks/<type>.py); tests/unit/test_task_schema_drift.py
# checks this list, and each task's options below, against the plugins.
TASK_TYPES = ("text-classification", "question-answering", "causal-lm")
PRECISIONS = ("fp32", "bf16")
CLEAN_POD_POLICIES = ("Running", "All")
PHASES = ("Queued", "Pending", "Precompiling", "Running", "Restarting", "Suspended", "Succeeded", "Failed")

# Upper bounds of the integers a user writes, each one the code that reads the value handles (a spec admission
# lets through must never overflow downstream, e.g. in every reconcile pass or every rank's first second):
# Durations in seconds (runPolicy.activeDeadlineSeconds, ttlSecondsAfterFinished, tolerationSeconds): 2^31-1
# (68 years), Kubernetes' own bound for a Job's ttlSecondsAfterFinished; the operator adds them to timestamps
# (datetime overflows past the year 9999) and the taint manager multiplies tolerationSeconds into a Go
# time.Duration (int64 nanoseconds, 292 years).
MAX_SECONDS = 2**31 - 1
# Counts of optimizer steps and of dataset rows: the same 2^31-1, far beyond any run, and exact in every type they
# pass through (the runtime's progress lines and ETA are float64, Kubernetes' integers int64).
MAX_COUNT = 2**31 - 1
# training.seed seeds numpy (transformers.set_seed), which refuses anything outside [0, 2^32-1].
MAX_SEED = 2**32 - 1


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


def _strlist(description: str, max_items: int = 256, **kw: Any) -> Schema:
    return {
        "type": "array",
        "description": description,
        "items": {"type": "string", "maxLength": 4096},
        "maxItems": max_items,
        **kw,
    }


def _quantities(description: str) -> Schema:
    """Resource name -> quantity, an integer or a string as in a Pod (`cpu: 2` or `cpu: 500m`); checked by
    podrules.py (CEL isQuantity() in the CRD)."""
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "maxLength": f.QUANTITY_MAX_LENGTH,  # strings only; bounds the CEL cost estimate
        },
        "maxProperties": 32,
    }


TOLERATION = _o(
    "A toleration, as in a Pod.",
    {
        "key": _s(
            "Taint key (a label key); empty with operator Exists tolerates every taint.", maxLength=f.QUALIFIED_NAME_MAX
        ),
        "operator": _s("Equal (the default) or Exists.", enum=["Equal", "Exists"]),
        "value": _s(
            "Taint value (a label value); empty with operator Exists.",
            maxLength=f.LABEL_VALUE_MAX,
            pattern=f.LABEL_VALUE,
        ),
        "effect": _s(
            "Taint effect to tolerate; empty: all effects.", enum=["", "NoSchedule", "PreferNoSchedule", "NoExecute"]
        ),
        "tolerationSeconds": _i(
            "How long a NoExecute taint is tolerated before eviction (effect NoExecute only; 0: evict at once).",
            minimum=0,
            maximum=MAX_SECONDS,
        ),
    },
)

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
        "stack": _s(
            "Software stack of the profile: trn1 offers xla (torch-neuronx on PyTorch/XLA, Neuron SDK 2.31); trn2 "
            "xla (the default) or native (TorchNeuron: native PyTorch with torch.compile's neuron backend, Neuron "
            "SDK 2.33 or newer); xeon-amx upstream (the default: current PyTorch, AMX through oneDNN) or ipex (IPEX "
            "2.7 and oneCCL, archived); cpu and nvidia upstream. Selects the image, the runtime backend, the "
            "compile cache and the stack's environment. Default: the profile's.",
            maxLength=32,
            pattern=f.STACK_NAME,
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
            "Neuron docs) which keeps NeuronCore IDs contiguous. Default: the cluster's default scheduler. A DNS "
            "subdomain.",
            maxLength=f.DNS_SUBDOMAIN_MAX,
            pattern=f.DNS_SUBDOMAIN,
        ),
        "resources": _o(
            "Per-pod requests/limits that replace the derived ones (keys as in a container's resources).",
            {
                "requests": _quantities(
                    "Resource requests, e.g. {cpu: '8', memory: 32Gi}. Derived requests "
                    "above a limit you set are lowered to it."
                ),
                "limits": _quantities(
                    "Resource limits. Device and hugepages resources (nvidia.com/gpu, "
                    "hugepages-2Mi) go here; their requests follow."
                ),
            },
        ),
        "nodeSelector": {
            "type": "object",
            "description": "Node labels, merged over the profile's (yours win). Keys are label keys, values label "
            "values.",
            "additionalProperties": _s("Label value.", maxLength=f.LABEL_VALUE_MAX, pattern=f.LABEL_VALUE),
            "maxProperties": 64,
        },
        "tolerations": {
            "type": "array",
            "description": "Tolerations, added to the profile's (e.g. aws.amazon.com/neuron).",
            "maxItems": 64,
            "items": TOLERATION,
        },
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
        "name": _s(
            "Hugging Face hub dataset, e.g. squad. Datasets that only ship a legacy loading script (e.g. "
            "mteb/amazon_reviews_multi) do not load by name with datasets 4 or newer: use dataFiles.",
            minLength=1,  # the runtime takes an empty name for no source at all
            maxLength=256,
        ),
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
        "path": _s(
            "Local file or directory; relative paths are relative to the working directory. In a "
            "directory, each file's name up to the first '.' or '-' is its split (train.jsonl -> train).",
            minLength=1,
            maxLength=1024,
        ),
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
        "messagesColumn": _s(
            "Chat column (causal-lm): a list of {role, content} turns (system, user, assistant) rendered with the "
            "tokenizer's chat template; the loss covers the assistant turns only. Default: messages. Rows "
            "without it use promptColumn and responseColumn.",
            maxLength=128,
        ),
        "promptColumn": _s(
            "Instruction column (causal-lm), used with responseColumn when a row has no "
            "messagesColumn; rendered as one user turn. Default: prompt.",
            maxLength=128,
        ),
        "responseColumn": _s(
            "Answer column (causal-lm) for promptColumn; the loss covers it only. Default: response.", maxLength=128
        ),
        "trainSamples": _i(
            "Train on this many rows, taken after label mapping from the split shuffled with "
            "training.seed (so files sorted by label still give every class).",
            minimum=1,
            maximum=MAX_COUNT,
        ),
        "evalSamples": _i(
            "Evaluate on this many rows, taken the same way from the evaluation split.", minimum=1, maximum=MAX_COUNT
        ),
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
            "Overlap between windows of long contexts (question-answering); less than half of maxLength, since "
            "each window also holds the question and the tokenizer's special tokens. The default fits the default "
            "maxLength; with maxLength 384, 128 is the usual choice.",
            minimum=1,
            maximum=4096,
            default=32,
        ),
        "labels": _strlist("Class names by id, e.g. [negative, positive]; saved in the model config.", 1024),
        "inferenceSamples": _strlist(
            "Inputs for the inference check run on the saved model: sentences to classify (text-classification), "
            "or prompts to answer as a user turn (causal-lm: greedy generations in predictions.json); "
            "question-answering takes inferenceQuestions. Default: built-in sentences, or the first prompts of "
            "the evaluation split.",
            64,
        ),
        "inferenceQuestions": {
            "type": "array",
            "description": "Questions for the inference check run on the saved model (question-answering). "
            "Default: the first three evaluation examples with their gold answers.",
            "maxItems": 64,
            "items": _o(
                "A question about a context.",
                {
                    "question": _s("The question.", minLength=1, maxLength=4096),
                    "context": _s("The text that holds the answer.", minLength=1, maxLength=65536),
                },
                required=["question", "context"],
            ),
        },
        "lora": _o(
            "Train LoRA adapters (peft) instead of every weight (causal-lm). The adapter is saved in the output's "
            "model/ (adapter_config.json, adapter_model.safetensors, loadable with peft's "
            "AutoPeftModelForCausalLM); with merge, the merged full model also in model-merged/.",
            {
                "r": _i("Rank of the update matrices.", minimum=1, maximum=1024, default=8),
                "alpha": _i(
                    "Scaling numerator (lora_alpha): updates are scaled by alpha/r.",
                    minimum=1,
                    maximum=4096,
                    default=16,
                ),
                "dropout": _n(
                    "Dropout on the adapters' input.", minimum=0, maximum=1, exclusiveMaximum=True, default=0.05
                ),
                "targetModules": _strlist(
                    "Module names to adapt, e.g. [q_proj, k_proj, v_proj, o_proj]. Default: peft's choice for "
                    "the model type (q_proj and v_proj on Llama).",
                    64,
                    minItems=1,
                ),
                "merge": _b("Also save the base model with the adapters merged in (model-merged/).", default=False),
            },
        ),
    },
    required=["type", "model", "dataset"],
)

TRAINING = _o(
    "Hyper-parameters for the built-in task. Immutable after creation.",
    {
        "epochs": _n("Training epochs.", minimum=0, exclusiveMinimum=True, maximum=10000, default=3),
        "maxSteps": _i("Stop after this many optimizer steps (overrides epochs).", minimum=1, maximum=MAX_COUNT),
        "learningRate": _n("Peak learning rate.", minimum=0, exclusiveMinimum=True, maximum=1, default=5e-5),
        "batchSizePerDevice": _i("Examples per process per step.", minimum=1, maximum=4096, default=8),
        "gradientAccumulationSteps": _i(
            "Steps accumulated per optimizer step.", minimum=1, maximum=MAX_COUNT, default=1
        ),
        "precision": _s(
            "fp32, or bf16 (Neuron: model cast to bf16 with stochastic rounding; Xeon: autocast on AMX; nvidia: "
            "autocast).",
            enum=list(PRECISIONS),
            default="fp32",
        ),
        "seed": _i(
            "Random seed for sampling, initialisation and shuffling (0 to 4294967295, what numpy accepts).",
            minimum=0,
            maximum=MAX_SEED,
            default=42,
        ),
        "checkpointEverySteps": _i(
            "Save a checkpoint to the output every N steps (and at each epoch end, unless the newest checkpoint "
            "is under a minute old); restarts resume from the newest complete one.",
            minimum=1,
            maximum=MAX_COUNT,
            default=500,
        ),
        "logEverySteps": _i("Progress line every N steps.", minimum=1, maximum=MAX_COUNT, default=10),
        "evalEverySteps": _i("Evaluate every N steps; default: at each epoch end.", minimum=1, maximum=MAX_COUNT),
        "warmupRatio": _n("Fraction of steps for learning-rate warm-up.", minimum=0, maximum=1, default=0.0),
        "weightDecay": _n("AdamW weight decay.", minimum=0, maximum=1, default=0.0),
        "compile": _b(
            "Train through torch.compile (CPU, Xeon, nvidia; on trn2's native stack with its neuron backend).",
            default=False,
        ),
    },
)

# The folder of a compile-cache claim that the pods mount at /cache (builders/pods.py): every job using the claim
# shares it, and none sees the rest of the claim, e.g. the output directories of jobs that use the same claim
# for spec.output (those are <output.path>/<namespace>/<job>; a namespace never starts with '.', and the
# output-path-not-cache rule keeps output.path out of it).
CACHE_FOLDER = ".finetune-cache"

COMPILE_CACHE = _o(
    "Shared cache for compiled graphs (Neuron NEFFs, torch.compile) and tokenized datasets, reused across ranks "
    f"and jobs on purpose: the claim's folder {CACHE_FOLDER} is mounted at /cache, so every job using the claim "
    "reads and writes the same cache, and none sees the rest of the claim (e.g. the outputs of jobs that use it "
    "as output.claimName). Use a claim per team (or per trust boundary) when jobs must not share compiled "
    "artifacts; the operator's policy can say which claims a namespace may use for what. Immutable after creation.",
    {
        "claimName": _s(
            f"ReadWriteMany PersistentVolumeClaim (EFS, FSx) whose folder {CACHE_FOLDER} is mounted at /cache "
            "(made by the kubelet when missing).",
            maxLength=f.DNS_SUBDOMAIN_MAX,
            pattern=f.DNS_SUBDOMAIN,
        ),
        "url": _s(
            "Neuron compile cache URL (s3://bucket/prefix) of the xla stack (trn1, trn2); used instead of "
            "/cache/neuron. Without claimName /cache is an emptyDir.",
            maxLength=1024,
            pattern=f.NEURON_CACHE_URL,
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
    "Where checkpoints, the final model, metrics and predictions go: a claim (and sub-path) or an S3 URL. "
    "Immutable after creation.",
    {
        "claimName": _s(
            "PersistentVolumeClaim mounted at /output (ReadWriteMany for multi-node).",
            maxLength=f.DNS_SUBDOMAIN_MAX,
            pattern=f.DNS_SUBDOMAIN,
        ),
        "path": _s(
            "Directory under the claim. The job's pods mount only <path>/<namespace>/<job name> of the "
            "claim at /output (made by the kubelet when missing), so jobs sharing a claim cannot overwrite "
            "each other's checkpoints or models. Without path: <namespace>/<job name>. A job re-created under "
            "the same name gets the same directory but starts fresh (unless resumeFrom says otherwise): its "
            "checkpoints go to checkpoints/<uid>/, and its predecessor's model, metrics and predictions are "
            "moved to previous/<their uid>/ before it writes its own.",
            maxLength=1024,
            pattern=r"^[^/].*$",
        ),
        "url": _s(
            "s3://bucket/prefix for the results. The job writes under <url>/<namespace>/<job name>/ only "
            "(status.output.location), laid out as a claim's directory: jobs sharing a URL never touch each "
            "other's files. /output is then scratch space: each checkpoint is uploaded to "
            "checkpoints/<uid>/ there as soon as it is saved (the job's newest 3 are kept) and a restarted "
            "group resumes from the newest complete one; the final model/, metrics.json and "
            "predictions.json go beside them. Pods need S3 credentials (e.g. IRSA or EKS Pod Identity) "
            "allowing ListBucket, GetObject, PutObject and DeleteObject; for an S3-compatible server set "
            "AWS_ENDPOINT_URL in spec.env.",
            maxLength=1024,
            pattern=f.S3_URL,
        ),
        "resumeFrom": _s(
            "Start from a checkpoint another job wrote (e.g. a deleted job of the same name, whose checkpoints "
            "a new job never resumes by itself): that job's status.output.location, a checkpoints/<uid>/ "
            "directory under it, or one checkpoint-<step>/ directory; the newest complete checkpoint there is "
            "used once, until this job has saved checkpoints of its own. Of the output's kind: with url an "
            "s3://bucket/prefix, with claimName a pvc://<claimName>/<directory> of the same claim (mounted "
            "read-only at /resume-from).",
            maxLength=1024,
            pattern="^(s3|pvc)://[^/]+(/.*)?$",
        ),
    },
)

RUN_POLICY = _o(
    "Restarts, deadlines and clean-up.",
    {
        "backoffLimit": _i(
            "Group restarts after a failure before the job is Failed. A failure: a rank's pod fails, its running "
            "pod is deleted by someone else (kubectl delete, an eviction that is not a drain), its node is lost "
            "(nodeLossSeconds) or rank 0 reports no progress (progressDeadlineSeconds). A node drain's restart "
            "does not count (drainRestartLimit). Every restart resumes from the newest checkpoint.",
            minimum=0,
            maximum=1000,
            default=3,
        ),
        "nodeLossSeconds": _i(
            "How long a node that runs one of the job's pods may stay not Ready (its Ready condition Unknown or "
            "False, as the node lifecycle controller declares it after the cluster's node-monitor grace period) "
            "before the group restarts without it: its pods there are force-deleted (they can never terminate "
            "gracefully), the failure is NodeLost naming the node, and it counts against backoffLimit. Far below "
            "the 300 s after which Kubernetes itself evicts pods from an unreachable node; above 300, give the "
            "pods tolerations for node.kubernetes.io/unreachable and not-ready that outlast it.",
            minimum=0,
            maximum=3600,
            default=60,
        ),
        "terminationGracePeriodSeconds": _i(
            "The pods' termination grace period: on a drain, an eviction or a deletion the runtime saves a "
            "checkpoint of the current step within it and exits (docs/runtime.md); the kubelet kills what is "
            "left when it ends. The default fits a small model's checkpoint and AWS's 2-minute Spot notice; "
            "raise it for checkpoints that take longer to write. A group that failed otherwise (a rank crashed or "
            f"hung, a node was lost) cannot save: what is left of it gets {c.FAILED_GROUP_GRACE_S} s, whether it "
            "restarts or the job ends.",
            minimum=0,
            maximum=3600,
            default=120,
        ),
        "drainRestartLimit": _i(
            "Group restarts because a rank pod was evicted through the eviction API (a node drain: kubectl "
            "drain, the AWS Node Termination Handler on a Spot interruption, Karpenter) before the job is "
            "Failed (DrainRestartLimitExceeded). Such a restart resumes from the step the drain interrupted and "
            "does not count against backoffLimit.",
            minimum=0,
            maximum=1000,
            default=10,
        ),
        "progressDeadlineSeconds": _i(
            "Restart the group (reason Hung, counted against backoffLimit) when rank 0 reports no new progress "
            "line for this long while the job is Running, e.g. a collective that hangs while every process stays "
            "alive. Counted from the attempt's first progress line: data preparation and compilation before it "
            "(and the precompile stage) are never a hang. At least 60 (the operator reads rank 0's log every 30 "
            "s); choose more than the longest silence of a healthy run (an evaluation, a checkpoint save). "
            "Unset: no hang detection.",
            minimum=60,
            maximum=MAX_SECONDS,
        ),
        "activeDeadlineSeconds": _i(
            "Fail the job when it runs longer than this (at most 2147483647, 68 years).", minimum=1, maximum=MAX_SECONDS
        ),
        "ttlSecondsAfterFinished": _i(
            "Delete the job (and, through owner references, every child) this long after it finished (at most "
            "2147483647).",
            minimum=0,
            maximum=MAX_SECONDS,
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
            "Kueue's reason. A label value. Needs Kueue with FineTuneJob.v1alpha1.finetune.dev in "
            "integrations.externalFrameworks (docs/operator.md).",
            maxLength=f.LABEL_VALUE_MAX,
            pattern=f.LABEL_VALUE,  # also the Workload's kueue.x-k8s.io/queue-name label
        ),
    },
    default={},
)


def _key_ref(what: str) -> Schema:
    return _o(
        f"A key of a {what} in the job's namespace.",
        {
            "name": _s(f"{what} name.", minLength=1, maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN),
            "key": _s("The key.", minLength=1, maxLength=f.CONFIG_KEY_MAX, pattern=f.CONFIG_KEY),
            "optional": _b(f"Whether the {what} or its key may be missing."),
        },
        required=["name", "key"],
    )


ENV_VAR = _o(
    "A container environment variable (as in a Pod): a value, or valueFrom with exactly one source. May not set "
    "a variable the operator sets (the FTJOB_* contract, MASTER_ADDR, thread and profile variables).",
    {
        "name": _s(
            "Variable name: printable ASCII except '='.", minLength=1, maxLength=f.ENV_NAME_MAX, pattern=f.ENV_NAME
        ),
        "value": _s("The value (a string: quote numbers and booleans in YAML).", maxLength=32768),
        "valueFrom": _o(
            "Where the value comes from (exactly one source).",
            {
                "fieldRef": _o(
                    "A field of the pod (downward API).",
                    {
                        "apiVersion": _s("API version of fieldPath.", enum=["v1"]),
                        "fieldPath": _s(
                            "e.g. metadata.name, status.podIP, metadata.labels['key'].", minLength=1, maxLength=512
                        ),
                    },
                    required=["fieldPath"],
                ),
                "resourceFieldRef": _o(
                    "A resource of the container, e.g. limits.cpu.",
                    {
                        "resource": _s(
                            "limits.cpu, limits.memory, limits.ephemeral-storage, requests.cpu, "
                            "requests.memory or requests.ephemeral-storage.",
                            maxLength=64,
                        ),
                        "divisor": _s(
                            "Unit of the value (a positive quantity), e.g. 1Mi.", maxLength=f.QUANTITY_MAX_LENGTH
                        ),
                    },
                    required=["resource"],
                ),
                "configMapKeyRef": _key_ref("ConfigMap"),
                "secretKeyRef": _key_ref("Secret"),
            },
        ),
    },
    required=["name"],
)

ENV_FROM = _o(
    "A ConfigMap or Secret whose keys become environment variables (exactly one of configMapRef, secretRef).",
    {
        "prefix": _s("Prepended to every key.", maxLength=f.ENV_NAME_MAX, pattern=f.ENV_NAME),
        "configMapRef": _o(
            "A ConfigMap in the job's namespace.",
            {
                "name": _s("ConfigMap name.", minLength=1, maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN),
                "optional": _b("Whether the ConfigMap may be missing."),
            },
            required=["name"],
        ),
        "secretRef": _o(
            "A Secret in the job's namespace.",
            {
                "name": _s("Secret name.", minLength=1, maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN),
                "optional": _b("Whether the Secret may be missing."),
            },
            required=["name"],
        ),
    },
)

SECRET_KEY_REF = _o(
    "Secret key holding a Hugging Face token (exported as HF_TOKEN) for gated models and datasets.",
    {
        "name": _s("Secret name.", maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN),
        "key": _s("Key in the Secret.", maxLength=f.CONFIG_KEY_MAX, pattern=f.CONFIG_KEY, default="token"),
    },
    required=["name"],
)

# spec.podTemplate: what a user adds to the pods the operator builds (builders/podtemplate.py), and what admission
# keeps from overriding the operator's own (builders/podtemplate_rules.py). Bounds keep the CEL rules over these
# lists within the API server's cost budget.
POD_ROLES = (c.ROLE_RANK, c.ROLE_WORKER, c.ROLE_LAUNCHER)
POD_TEMPLATE_MAX_VOLUMES = 32
POD_TEMPLATE_MAX_MOUNTS = 32
POD_TEMPLATE_MAX_INIT_CONTAINERS = 8
POD_TEMPLATE_MAX_PULL_SECRETS = 8
# Annotations of a pod may hold 256 KiB (keys and values, in bytes); counted in characters, which the CEL rule
# and `ftjob render` count alike, this bound keeps even 4-byte characters under it.
POD_TEMPLATE_ANNOTATION_CHARS = 65536
# Volume sources of a Pod (core/v1 Volume): each is passed through as written, checked by the API server when the
# pods are made; which ones a job may use is the operator's policy (policy.allowedVolumeTypes).
VOLUME_SOURCES = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
)

_NOT_SETTABLE_SECURITY = (
    "Not settable: the operator sets every pod's and container's securityContext (the profile's non-root user "
    "and group, fsGroup, seccomp RuntimeDefault, no privilege escalation, every capability dropped: what Pod "
    "Security's restricted profile asks). Remove it; an image that needs root cannot run in the job's pods."
)

VOLUME = {
    "type": "object",
    "description": "A volume, as in a Pod: a name and exactly one source (persistentVolumeClaim, configMap, "
    "secret, emptyDir, csi, ephemeral, projected, ...). The source is passed through as written and checked by "
    "the API server when the pods are made; the operator's policy (policy.allowedVolumeTypes; default: the types "
    "Pod Security's restricted profile allows, so no hostPath) says which sources a job may use, and Secrets and "
    "claims named here count against policy.allowedSecrets and policy.allowedClaims.",
    "properties": {
        "name": _s(
            "Volume name (a DNS label), unique in the pod; not one of the operator's own volumes (config, home, "
            "dshm, tmp, cache, output, ssh).",
            maxLength=f.DNS_LABEL_MAX,
            pattern=f.DNS_LABEL,
        ),
        **{
            src: _o(
                "A PersistentVolumeClaim in the job's namespace, e.g. a static FSx for Lustre volume's claim.",
                {
                    "claimName": _s(
                        "The claim's name.", minLength=1, maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN
                    ),
                    "readOnly": _b("Mount it read-only."),
                },
                required=["claimName"],
            )
            if src == "persistentVolumeClaim"
            else _free(
                f"Volume source {src}, as in a Pod, passed through as written: the API server checks it when the "
                "pods are made, and policy.allowedVolumeTypes says whether a job may use it."
            )
            for src in VOLUME_SOURCES
        },
    },
    "required": ["name"],
}

VOLUME_MOUNT = _o(
    "Where a volume of spec.podTemplate.volumes appears in a container.",
    {
        "name": _s(
            "Name of a volume in spec.podTemplate.volumes.", minLength=1, maxLength=f.DNS_LABEL_MAX, pattern=f.DNS_LABEL
        ),
        "mountPath": _s(
            "Absolute path in the container, e.g. /data; unique in the container. In the operator's containers "
            "(spec.podTemplate.volumeMounts) not at or under a path the operator mounts: /etc/ftjob (config and "
            "ssh keys), /home/ftjob, /dev/shm, /tmp, /cache, /output, /resume-from.",
            maxLength=1024,
            pattern=f.MOUNT_PATH,
        ),
        "subPath": _s(
            "Mount this directory of the volume instead of its root (relative, no '..').",
            maxLength=1024,
            pattern=f.SUB_PATH,
        ),
        "readOnly": _b("Mount read-only."),
    },
    required=["name", "mountPath"],
)

CONTAINER = _o(
    "An init container, or with restartPolicy Always a native sidecar (Kubernetes 1.29+), as in a Pod. It runs "
    "with the operator's security context, only the environment it sets itself (never the job's FTJOB_* "
    "contract, nor spec.env), and mounts only volumes of spec.podTemplate.volumes.",
    {
        "name": _s(
            "Container name (a DNS label), unique in the pod; not one of the operator's containers (trainer, "
            "sshd, launcher, wait-for-peers, precompile).",
            minLength=1,
            maxLength=f.DNS_LABEL_MAX,
            pattern=f.DNS_LABEL,
        ),
        "image": _s(
            "Container image. Default: the job's image (spec.image, else the profile's). The operator's policy "
            "(policy.allowedSidecarImages, else policy.allowedImages) says which images are allowed.",
            maxLength=1024,
            pattern=f.IMAGE,
        ),
        "imagePullPolicy": _s(
            "Image pull policy. Default: spec.imagePullPolicy.", enum=["Always", "IfNotPresent", "Never"]
        ),
        "command": _strlist("Entrypoint (the image's when absent)."),
        "args": _strlist("Arguments to the entrypoint."),
        "workingDir": _s("Working directory (the image's when absent).", maxLength=4096),
        "restartPolicy": _s(
            "Always: a native sidecar. It starts before the init containers after it and the main containers, "
            "runs beside them, and is stopped when they have finished, so it never keeps a finished rank pod "
            "alive. Absent: an init container that must complete before the next one starts.",
            enum=["Always"],
        ),
        "env": {
            "type": "array",
            "description": "Environment of this container (as in a Pod); not FTJOB_* nor a device-visibility variable.",
            "items": ENV_VAR,
            "maxItems": 64,
        },
        "envFrom": {
            "type": "array",
            "description": "ConfigMaps/Secrets whose keys become environment variables of this container.",
            "items": ENV_FROM,
            "maxItems": 16,
        },
        "resources": _o(
            "Requests and limits of cpu, memory and ephemeral-storage (no devices: those belong to the ranks). "
            "The pod's requests grow by a sidecar's, and Kueue counts them.",
            {
                "requests": _quantities("Resource requests, e.g. {cpu: 100m, memory: 64Mi}."),
                "limits": _quantities("Resource limits."),
            },
        ),
        "volumeMounts": {
            "type": "array",
            "description": "Volumes of spec.podTemplate.volumes to mount (any path).",
            "items": VOLUME_MOUNT,
            "maxItems": POD_TEMPLATE_MAX_MOUNTS,
        },
        "securityContext": _free(_NOT_SETTABLE_SECURITY),
    },
    required=["name"],
)

POD_TEMPLATE = _o(
    "What to add to the pods the operator builds (Kubeflow's pod template overrides, within what the operator "
    "derives): labels, annotations, a priority class and image pull secrets on every pod; volumes, their mounts "
    "and init or sidecar containers on the pods of `roles`. What the operator sets stays its own: its labels "
    "(app.kubernetes.io/name, instance, managed-by, part-of, component and every finetune.dev/ key), its "
    "volumes, mount paths, container names, environment, device resources and security context; admission "
    "refuses a template that would override them. Immutable after creation.",
    {
        "metadata": _o(
            "Labels and annotations for every pod of the job (the MPI launcher too) and for the pod sets of its "
            "Kueue Workload.",
            {
                "labels": {
                    "type": "object",
                    "description": "Labels, e.g. {team: nlp}. Not the operator's own keys, nor any finetune.dev/ or "
                    "kueue.x-k8s.io/ key (the operator queues the job through spec.runPolicy.queueName, and "
                    "Kueue's labels on the pods would queue them a second time).",
                    "additionalProperties": _s("Label value.", maxLength=f.LABEL_VALUE_MAX, pattern=f.LABEL_VALUE),
                    "maxProperties": 64,
                },
                "annotations": {
                    "type": "object",
                    "description": "Annotations, e.g. {karpenter.sh/do-not-disrupt: 'true'} (keep nodes from "
                    "being consolidated under a running job). Not any finetune.dev/ or kueue.x-k8s.io/ key; at "
                    f"most {POD_TEMPLATE_ANNOTATION_CHARS} characters in all, keys and values.",
                    "additionalProperties": {"type": "string", "maxLength": POD_TEMPLATE_ANNOTATION_CHARS},
                    "maxProperties": 64,
                },
            },
        ),
        "priorityClassName": _s(
            "PriorityClass of every pod of the job (the scheduler's preemption order). With "
            "spec.runPolicy.queueName it is also the Kueue Workload's priority (priorityClassRef and priority, "
            "read from the PriorityClass when the Workload is made), as Kueue's own integrations take it from "
            "the pod template. The class must exist. A DNS subdomain.",
            maxLength=f.DNS_SUBDOMAIN_MAX,
            pattern=f.DNS_SUBDOMAIN,
        ),
        "imagePullSecrets": {
            "type": "array",
            "description": "Secrets (kubernetes.io/dockerconfigjson, in the job's namespace) the kubelet logs in to "
            "a private registry with when it pulls the images of every pod of the job (the MPI launcher too), "
            "e.g. [{name: registry-pull}]. Added to those of the pods' ServiceAccount.",
            "items": _o(
                "A Secret in the job's namespace.",
                {"name": _s("Secret name.", minLength=1, maxLength=f.DNS_SUBDOMAIN_MAX, pattern=f.DNS_SUBDOMAIN)},
                required=["name"],
            ),
            "maxItems": POD_TEMPLATE_MAX_PULL_SECRETS,
        },
        "roles": {
            "type": "array",
            "description": "Which pods get volumes, volumeMounts and initContainers: rank (torchrun's pods), "
            "worker (MPI's rank pods) and launcher (the MPI launcher, which runs mpirun and holds no rank). "
            "Default: the pods that hold ranks (rank, or worker). Labels, annotations and priorityClassName "
            "always go to every pod.",
            "items": _s("A pod role.", enum=list(POD_ROLES)),
            "minItems": 1,
            "maxItems": len(POD_ROLES),
        },
        "volumes": {
            "type": "array",
            "description": "Volumes added to the pods of `roles`, e.g. a dataset on FSx for Lustre "
            "({name: data, persistentVolumeClaim: {claimName: fsx-datasets, readOnly: true}}).",
            "items": VOLUME,
            "maxItems": POD_TEMPLATE_MAX_VOLUMES,
        },
        "volumeMounts": {
            "type": "array",
            "description": "Mounts of spec.podTemplate.volumes added to every container the operator runs in the "
            "pods of `roles` (trainer, sshd or launcher, and the wait-for-peers and precompile init containers), "
            "e.g. {name: data, mountPath: /data, readOnly: true}.",
            "items": VOLUME_MOUNT,
            "maxItems": POD_TEMPLATE_MAX_MOUNTS,
        },
        "initContainers": {
            "type": "array",
            "description": "Init containers and native sidecars (restartPolicy: Always) of the pods of `roles`, in "
            "this order before the operator's own init containers (wait-for-peers, precompile): data "
            "preparation and sidecars are in place before the operator's first step.",
            "items": CONTAINER,
            "maxItems": POD_TEMPLATE_MAX_INIT_CONTAINERS,
        },
        "securityContext": _free(_NOT_SETTABLE_SECURITY),
    },
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
        "image": _s(
            "Container image; default per profile from the operator's configuration.", maxLength=1024, pattern=f.IMAGE
        ),
        "imagePullPolicy": _s("Image pull policy.", enum=["Always", "IfNotPresent", "Never"]),
        "serviceAccountName": _s(
            "Service account for the pods (e.g. one with IRSA for S3): a DNS subdomain.",
            maxLength=f.DNS_SUBDOMAIN_MAX,
            pattern=f.DNS_SUBDOMAIN,
        ),
        "task": TASK,
        "command": _strlist(
            "Bring-your-own command run in every rank pod (torchrun) or by mpirun (mpi) instead of the built-in "
            "task. The rank environment is injected; nothing else is assumed. torchrun pods get PET_NNODES, "
            "PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT (torchrun's defaults, as "
            "Kubeflow's PyTorchJob sets them), so [torchrun, train.py] forms one world across the pods. "
            "`ftjob run` runs it locally the same way. Immutable after creation.",
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
        "envFrom": {
            "type": "array",
            "description": "ConfigMaps/Secrets whose keys become environment variables.",
            "items": ENV_FROM,
            "maxItems": 32,
        },
        "hfTokenSecretRef": SECRET_KEY_REF,
        "podTemplate": POD_TEMPLATE,
        "runPolicy": RUN_POLICY,
    },
    required=["hardware"],
)

CONDITION = _o(
    "A condition of the job.",
    {
        "type": _s(
            "Queued, Created, Precompiling, Running, Restarting, Suspended, Succeeded, Failed, ReconcileError, "
            "ForeignChildren (objects carry the job's labels but are not controlled by it), NodeLost (a node of "
            "the job's pods is not Ready: the message says since when and when the group restarts)."
        ),
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
        "restartCount": _i("Group restarts so far (the attempt the pods belong to), drains' included."),
        "drainRestarts": _i("Group restarts that a node drain caused (not counted against backoffLimit)."),
        "lastProgressTime": _s(
            "When the operator last saw rank 0 report new progress in this attempt (progressDeadlineSeconds "
            "counts from here); absent until the attempt's first progress line.",
            format="date-time",
        ),
        "ranks": _o(
            "Rank pods.",
            {"ready": _i("Pods running or done."), "total": _i("Pods that hold ranks.")},
        ),
        "worldSize": _i("Training processes in total."),
        "startTime": _s(
            "When the pods were first created (activeDeadlineSeconds counts from here).", format="date-time"
        ),
        "completionTime": _s("When the job finished.", format="date-time"),
        "observedGeneration": _i("Generation of the spec last reconciled."),
        "output": _o(
            "Where the job writes.",
            {
                "location": _s(
                    "The job's own location: s3://<output.url>/<namespace>/<job>/ or "
                    "pvc://<output.claimName>/<output.path>/<namespace>/<job>/. It holds job.json (the job whose "
                    "final artefacts lie there), model/, metrics.json, predictions.json, checkpoints/<uid>/ and "
                    "previous/<uid>/ (final artefacts of earlier jobs of the same name)."
                )
            },
        ),
        "progress": _free(
            "Latest progress reported by rank 0: step, totalSteps, epoch, loss, samplesPerSecond, "
            "etaSeconds, metrics, summaryMetric (the task's headline metric), summary, what throughput is derived "
            "from (tokens, precision, the model's numbers), and timeToFirstStepSeconds (from the start of the main "
            "process of the pod that launches rank 0 to the end of rank 0's first training step, newest attempt; "
            "see docs/runtime.md)."
        ),
        "throughput": _o(
            "Training speed as rank 0 measured it, with the model FLOPs and MFU the operator derives from it "
            "(docs/operator.md, 'Throughput and MFU'). A field is absent where nothing gives it: a spec.command "
            "job shows what its own progress lines print.",
            {
                "samplesPerSecond": _n("Samples/s over all ranks between rank 0's last two progress lines."),
                "meanSamplesPerSecond": _n("Samples/s over all ranks since the first logged step."),
                "tokensPerSecond": _n("Non-padding tokens/s (attention-mask tokens) over all ranks."),
                "paddedTokensPerSecond": _n("Tokens/s as computed on, padding included, over all ranks."),
                "paddedTokensPerSample": _n("Mean padded length of a training sample (what FLOPs count)."),
                "flopsPerSample": _n(
                    "Model FLOPs of one training sample, forward and backward: S·(6·N + 12·L·H·S), LoRA's frozen "
                    "weights at 4 per token (estimate/flops.py), from the model as the runtime loaded it."
                ),
                "model": _o(
                    "The model's numbers as rank 0 counted them on the loaded model.",
                    {
                        "layers": _i("Transformer layers (L)."),
                        "attentionWidth": _i("Query heads × head dim (H)."),
                        "trainableMatmulParams": _i("Weights of the linear layers that train."),
                        "frozenMatmulParams": _i("Weights of frozen linear layers (LoRA's base)."),
                        "trainableParams": _i("Every trained weight (what data parallelism all-reduces)."),
                    },
                ),
                "precision": _s("The precision the peak is taken at.", enum=list(PRECISIONS)),
                "device": _s("The device kind of the job's hardware (its profile's throughput data)."),
                "devices": _n("Devices the job computes on: ranks × devices per rank (cores or vCPUs on CPUs)."),
                "peakFlopsPerSecond": _n("Dense peak FLOP/s of those devices at the precision (profile data)."),
                "mfu": _n("Model FLOPs utilisation: samplesPerSecond × flopsPerSample / peakFlopsPerSecond (0-1)."),
                "summary": _s("Short text for the THROUGHPUT column, e.g. '149 samples/s, MFU 31%'."),
            },
        ),
        "compileCache": _o(
            "What the precompile trial (compileCache.precompile) of the latest attempt found in the compile cache, "
            "as rank 0 reported it. warm: the trial compiled nothing new (torch.compile: every graph came from the "
            "cache; Neuron: the cache held entries and the trial added none).",
            {
                "warm": {"type": "boolean", "description": "The trial compiled nothing new."},
                "graphHits": _i("Graphs loaded from the cache (torch.compile's AOTAutograd and FX graph caches)."),
                "graphMisses": _i("Graphs compiled by the trial (0 when warm)."),
                "entriesBefore": _i("Files in the cache directory before the trial."),
                "entriesAfter": _i("Files in the cache directory after the trial."),
                "trialSeconds": {"type": "number", "description": "Duration of the trial's training steps."},
                "steps": _i("Steps the trial ran (compileCache.precompileSteps)."),
                "time": _s("When the trial finished (as rank 0's clock said)."),
                "attempt": _i("restartCount of the attempt whose trial this was."),
            },
        ),
        "foreignChildren": {
            "type": "array",
            "description": "Objects that carry this job's labels but whose controller owner reference is not this "
            "job (e.g. left by a deleted job of the same name, or made by someone else). The operator never uses, "
            "mounts, deletes or adopts them; while one holds the name of a child the job needs, no pods are "
            "created. Delete them, or re-create the job under another name.",
            "maxItems": 32,
            "items": _o(
                "A foreign object.",
                {
                    "kind": _s("Pod, Service, ConfigMap or NetworkPolicy."),
                    "name": _s("Its name."),
                    "controllerUid": _s("uid of its controller owner; absent when it has none."),
                },
            ),
        },
        "failures": {
            "type": "array",
            "description": "Most recent failures and drains that restarted the group or failed the job (newest last).",
            "maxItems": 10,
            "items": _o(
                "A failed rank pod.",
                {
                    "attempt": _i("restartCount when it failed."),
                    "pod": _s("Pod name."),
                    "rank": _i("Pod index."),
                    "exitCode": _i("Exit code of the failed container."),
                    "reason": _s(
                        "Container reason, e.g. Error or OOMKilled; Evicted for a pod the kubelet evicted; "
                        "Deleted for a running pod deleted by someone else; Drained for a pod evicted through "
                        "the eviction API (a node drain); NodeLost for a pod whose node stayed not Ready for "
                        "runPolicy.nodeLossSeconds; Hung when rank 0 reported no progress for "
                        "runPolicy.progressDeadlineSeconds."
                    ),
                    "node": _s("The node the pod ran on (NodeLost, Drained)."),
                    "step": _i("The newest training step rank 0 had reported when it happened."),
                    "time": _s("When the operator recorded it.", format="date-time"),
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
