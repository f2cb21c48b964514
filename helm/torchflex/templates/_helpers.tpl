{{/*
Names, labels and the derived settings every template shares.
*/}}

{{- define "torchflex.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "torchflex.fullname" -}}
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

{{/* Cluster-scoped objects carry the release namespace: two releases may share a name. */}}
{{- define "torchflex.clusterName" -}}
{{- printf "%s-%s" (include "torchflex.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "torchflex.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "torchflex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchflex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object of the release, without the component. */}}
{{- define "torchflex.commonLabels" -}}
helm.sh/chart: {{ include "torchflex.chart" . }}
app.kubernetes.io/name: {{ include "torchflex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: torchflex
{{- end }}

{{- define "torchflex.labels" -}}
{{ include "torchflex.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "torchflex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "torchflex.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "torchflex.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The deprecated `peering` values of earlier charts (kopf peering), or an empty dict. */}}
{{- define "torchflex.oldPeering" -}}
{{- toJson (.Values.peering | default dict) }}
{{- end }}

{{/*
"true" when leader election on a Lease (active/standby) is on. A `peering.enabled` set by
an earlier release's values still decides when leaderElection.enabled is left at "auto".
*/}}
{{- define "torchflex.leaderElection" -}}
{{- $on := .Values.leaderElection.enabled }}
{{- $old := include "torchflex.oldPeering" . | fromJson }}
{{- if and (eq (toString $on) "auto") (hasKey $old "enabled") }}
{{- $on = $old.enabled }}
{{- end }}
{{- if eq (toString $on) "auto" }}
{{- if gt (int .Values.replicaCount) 1 }}true{{ else }}false{{ end }}
{{- else }}
{{- toString $on }}
{{- end }}
{{- end }}

{{/* The Lease lives in the release namespace: the release's full name is unique there. */}}
{{- define "torchflex.leaseName" -}}
{{- $old := include "torchflex.oldPeering" . | fromJson }}
{{- .Values.leaderElection.leaseName | default $old.name | default (include "torchflex.fullname" .) }}
{{- end }}

{{- define "torchflex.namespaced" -}}
{{- if eq .Values.watch.mode "namespaced" }}true{{ else }}false{{ end }}
{{- end }}

{{/* Namespaces that get the worker ServiceAccount, as a JSON list. */}}
{{- define "torchflex.workerNamespaces" -}}
{{- if .Values.workerServiceAccount.namespaces }}
{{- toJson .Values.workerServiceAccount.namespaces }}
{{- else if eq .Values.watch.mode "namespaced" }}
{{- toJson .Values.watch.namespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
Cross-field rules the JSON schema cannot say clearly; each fails with the fix.
*/}}
{{- define "torchflex.validate" -}}
{{- if eq .Values.image.tag "latest" }}
{{- fail "image.tag: \"latest\" is refused: pin a version (or set image.digest) so every replica runs the same operator" }}
{{- end }}
{{- if and (eq .Values.watch.mode "namespaced") (not .Values.watch.namespaces) }}
{{- fail "watch.namespaces: list at least one namespace when watch.mode is \"namespaced\"" }}
{{- end }}
{{- if and (eq .Values.watch.mode "cluster") .Values.watch.namespaces }}
{{- fail "watch.namespaces: must be empty when watch.mode is \"cluster\" (set watch.mode=namespaced to restrict the operator)" }}
{{- end }}
{{- if and (eq (include "torchflex.leaderElection" .) "false") (gt (int .Values.replicaCount) 1) }}
{{- fail "replicaCount > 1 needs leader election (leaderElection.enabled: auto or true): without it every replica would reconcile the same jobs" }}
{{- end }}
{{- with .Values.leaderElection }}
{{- if ge (float64 .renewDeadlineSeconds) (float64 .leaseDurationSeconds) }}
{{- fail "leaderElection.renewDeadlineSeconds must be shorter than leaseDurationSeconds: a holder that cannot renew must stop before a standby may take over" }}
{{- end }}
{{- if le (float64 .renewDeadlineSeconds) (mulf 1.2 .retryPeriodSeconds) }}
{{- fail "leaderElection.renewDeadlineSeconds must exceed 1.2 x retryPeriodSeconds (room for a jittered retry)" }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled: the ServiceMonitor scrapes the metrics Service" }}
{{- end }}
{{- if and .Values.metrics.prometheusRule.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.prometheusRule.enabled needs metrics.enabled: its alerts read the operator's metrics" }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (le (int .Values.replicaCount) (int .Values.podDisruptionBudget.minAvailable)) }}
{{- fail "podDisruptionBudget.minAvailable must be lower than replicaCount, or no node could ever be drained" }}
{{- end }}
{{- end }}

{{/*
RBAC rules, derived from the code (tests/unit/install/test_rbac_derived.py re-derives them
and compares). Namespaced resources: what torchflex_operator/kube/ calls plus what kopf
watches for handlers.py.
*/}}
{{- define "torchflex.namespacedRules" -}}
# ElasticJobs: kopf watches them (list, watch); the reconciler reads one (get), writes an
# absent spec.replicas (patch, guarded by resourceVersion; docs/api.md) and deletes
# finished ones after ttlSecondsAfterFinished (delete).
- apiGroups: [torchflex.io]
  resources: [elasticjobs]
  verbs: [get, list, watch, patch, delete]
# Status is written once per pass, guarded by resourceVersion (merge patch).
- apiGroups: [torchflex.io]
  resources: [elasticjobs/status]
  verbs: [patch]
# Owned pods and Services carry blockOwnerDeletion: clusters with the
# OwnerReferencesPermissionEnforcement admission plugin require this.
- apiGroups: [torchflex.io]
  resources: [elasticjobs/finalizers]
  verbs: [update]
# Worker, store and etcd pods: watched by kopf, listed per job, created and deleted;
# a warm spare's torchflex.io/standby annotation patched to promote it.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, patch, delete]
# Headless Services of a job: watched by kopf, created (they go with the job).
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create]
# Each job's NetworkPolicy: watched by kopf, created, deleted when a job opts out.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, delete]
# The operator's decisions as Events on the ElasticJob.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Each job's PodGroup (gang scheduling of its minimum): created, read and its minCount
# patched when minReplicas changes; it goes with the job. Granted where the cluster
# does not serve the API too (RBAC takes rules for any resource); unused there.
- apiGroups: [scheduling.k8s.io]
  resources: [podgroups]
  verbs: [create, get, patch]
# Each live job's PodDisruptionBudget (disruption.py): created, read and patched when
# minReplicas changes, deleted when the job has finished.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, get, patch, delete]
# Kueue admission of a job labelled kueue.x-k8s.io/queue-name: its Workload is watched
# by kopf, read, created, and deleted when the job's replicas change (it is created
# anew) or its queue label is removed; its status is patched to release an evicted
# job's quota reservation and to mark it Finished (Kueue's external-framework
# contract). Unused where Kueue is not installed.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, watch, get, create, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}

{{/* Leader election: the one Lease in the release namespace (templates/rbac.yaml). */}}
{{- define "torchflex.leaseRules" -}}
# Create cannot be limited to a name (the name is in the body); everything else is.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "torchflex.leaseName" . }}]
  verbs: [get, update]
{{- end }}

{{/* Cluster-scoped reads kopf needs in both modes. */}}
{{- define "torchflex.clusterRules" -}}
# kopf watches CRDs to notice the ElasticJob CRD being (re)installed.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if eq .Values.watch.mode "namespaced" }}
# kopf lists and watches namespaces to know which of the watched ones exist.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
# A queued job's WorkloadPriorityClass (cluster-scoped): its value is the Workload's priority.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloadpriorityclasses]
  verbs: [get]
{{- if .Values.operator.watchNodes }}
# --watch-nodes: lost nodes make the operator force-delete their pods.
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
{{- end }}
{{- end }}
