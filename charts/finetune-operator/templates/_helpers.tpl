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

{{/*
The operator image: repository@digest when a digest is set (a released chart: no push can change it), else
repository:tag.
*/}}
{{- define "finetune-operator.image" -}}
{{- with .Values.operator.image.digest }}
{{- printf "%s@%s" $.Values.operator.image.repository . }}
{{- else }}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
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
through one Role per watched namespace. Exactly the verbs the operator is seen to use in the API server's
audit log (tests/controlplane/test_rbac_audit.py fails on a grant never used and on a use never granted).
*/}}
{{- define "finetune-operator.namespacedRules" -}}
# FineTuneJobs: kopf lists and watches them and patches metadata (its finalizer and the
# last-handled-configuration and progress annotations); the reconcile loop gets one fresh before each
# pass; delete removes a finished job once runPolicy.ttlSecondsAfterFinished has elapsed. The operator
# never creates or updates them.
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Status subresource: phase, conditions and progress, written by merge patch only.
- apiGroups: ["finetune.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["patch"]
# Rank, launcher and worker pods: created from the job, watched (label-filtered) for phase and exit codes,
# deleted (uid precondition) on restart/suspend/finish, read back by name after a 409 to check the job controls
# it, and patched (uid-tested) only to put back identity labels someone edited. The garbage collector deletes
# them with the job (owner references).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The newest FTJOB_PROGRESS line is read from the log of the pod that carries global rank 0.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# The headless Service (stable rank DNS names) and ConfigMap {job}-config (config.json, hostfile): created
# once, never deleted by the operator (the garbage collector removes them with the job), listed and watched
# label-filtered for its in-memory indexes, read back by name after a 409, and patched (uid-tested) only to put
# back identity labels someone edited.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Secret {job}-ssh (an MPI job's SSH identity): created once, read back by name after a 409. Never listed or
# watched, so the operator cannot enumerate the namespace's Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# Events on the FineTuneJob (phase changes, restarts, reconcile errors), posted through the core API; patch
# aggregates repeats.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# Kueue (jobs with runPolicy.queueName): the job's Workload is created, listed and watched label-filtered (kopf
# starts that watch only once Kueue's CRDs exist), read back after a 409, patched (uid-tested) only to put back
# edited identity labels, deleted (uid precondition) when the job's queueName is removed, and its status
# patched: PodsReady, Finished when the job ends, quota released after an eviction. The garbage collector
# deletes it with the job. Harmless where Kueue is not installed.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- if .Values.networkPolicy.enabled }}
# networkPolicy.enabled: one NetworkPolicy per job ({job}: ingress only from that job's pods), created,
# watched by the job's labels, read back after a 409 and relabelled like the other children; the garbage
# collector deletes it with the job.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end }}
{{- end }}

{{/*
The operator pods' preferred anti-affinity (replicaCount > 1): spread over nodes (kubernetes.io/hostname).
*/}}
{{- define "finetune-operator.spreadReplicas" -}}
preferredDuringSchedulingIgnoredDuringExecution:
  - weight: 100
    podAffinityTerm:
      topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "finetune-operator.selectorLabels" . | nindent 10 }}
{{- end }}

{{/*
crds.install and crds.keep, true unless set: `helm upgrade --reuse-values` from a chart without them (the crds/
layout) renders with the old release's values, where they are missing. "true" or "".
*/}}
{{- define "finetune-operator.crds.install" -}}
{{- $crds := .Values.crds | default dict }}
{{- if or (not (hasKey $crds "install")) $crds.install }}true{{ end }}
{{- end }}

{{- define "finetune-operator.crds.keep" -}}
{{- $crds := .Values.crds | default dict }}
{{- if or (not (hasKey $crds "keep")) $crds.keep }}true{{ end }}
{{- end }}
