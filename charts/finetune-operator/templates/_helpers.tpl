{{/*
Names and labels shared by every template.
*/}}

{{/* Chart name, overridable. */}}
{{- define "finetune-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release name when it already contains the chart name (so `helm install finetune-operator`
gives "finetune-operator", not "finetune-operator-finetune-operator"). Truncated to 63 characters because
some fields are DNS labels.
*/}}
{{- define "finetune-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "finetune-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's selector is immutable), so no version here.
*/}}
{{- define "finetune-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finetune-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels. app.kubernetes.io/managed-by is Helm's here; rank pods carry
app.kubernetes.io/managed-by=finetune-operator instead (set by the operator), which is what the
NetworkPolicy selects on, so the operator's own pod never matches that policy.
*/}}
{{- define "finetune-operator.labels" -}}
helm.sh/chart: {{ include "finetune-operator.chart" . }}
{{ include "finetune-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: finetune-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "finetune-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "finetune-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "finetune-operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{/*
A runtime image reference: kept as given when it has a tag or digest (a ":" or "@" after the last "/",
so a registry port such as "registry:5000/x" is not mistaken for a tag), else the shared tag is appended.
Call with (list $ image).
*/}}
{{- define "finetune-operator.runtimeImage" -}}
{{- $root := index . 0 }}
{{- $image := index . 1 }}
{{- $last := last (splitList "/" $image) }}
{{- if or (contains ":" $last) (contains "@" $last) }}
{{- $image }}
{{- else }}
{{- printf "%s:%s" $image (default $root.Chart.AppVersion $root.Values.runtimeImages.tag) }}
{{- end }}
{{- end }}

{{/*
Namespaces that get per-namespace objects (cache claim, NetworkPolicy): the explicit list, else the
watched namespaces, else the release namespace. Emits a JSON list; use with fromJsonArray.
Call with (list $ explicitList).
*/}}
{{- define "finetune-operator.targetNamespaces" -}}
{{- $root := index . 0 }}
{{- $explicit := index . 1 }}
{{- if $explicit }}
{{- toJson (uniq $explicit) }}
{{- else if $root.Values.watchNamespaces }}
{{- toJson (uniq $root.Values.watchNamespaces) }}
{{- else }}
{{- toJson (list $root.Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
What the operator does in a namespace that holds FineTuneJobs. Bound cluster-wide in cluster mode, or
through one Role per watched namespace. Every verb is used by the operator; nothing more is granted.
*/}}
{{- define "finetune-operator.namespacedRules" -}}
# FineTuneJobs: kopf lists and watches them and patches metadata (its finalizer and the
# last-handled-configuration and progress annotations); the reconcile loop gets one fresh before each
# pass; delete removes a finished job once runPolicy.ttlSecondsAfterFinished has elapsed. The operator
# never creates or updates them.
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status subresource: phase, conditions and progress are written by merge patch, or replaced whole by
# update; get reads it back after a 409 before deciding whether to retry.
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["get", "patch", "update"]
# Rank, launcher and worker pods: created from the job, watched for phase and exit codes, deleted on
# restart/suspend (owner references let the garbage collector clean up after job deletion).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The newest FTJOB_PROGRESS line is read from the log of the pod that carries global rank 0.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Per-job children: the headless Service (stable rank DNS names), ConfigMap {job}-config (config.json,
# hostfile) and Secret {job}-ssh (MPI keys). Never edited in place: the operator creates them, lists
# and watches them (label-filtered, for its in-memory indexes), reads one back after a 409 to check
# that the job owns it, and deletes on clean-up (the garbage collector also removes them with the job,
# through owner references).
- apiGroups: [""]
  resources: ["services", "configmaps", "secrets"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Events on the FineTuneJob (phase changes, restarts, reconcile errors), posted through the core API;
# the same verbs in events.k8s.io, the API newer clients post through; patch aggregates repeats.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Kueue (jobs with runPolicy.queueName): the job's Workload is created, read every pass while queued (and
# after a 409), and its status patched: Finished when the job ends, quota released after an eviction. The
# garbage collector deletes it with the job. Harmless where Kueue is not installed.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "create"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- if .Values.networkPolicy.enabled }}
# networkPolicy.enabled: one NetworkPolicy per job ({job}: ingress only from that job's pods), created,
# listed by the job's labels and read back after a 409 like the other children; the garbage collector
# deletes it with the job.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
{{- end }}
