{{/*
Every object name comes from these helpers, and every reference to an object (the
DaemonSet's serviceAccountName, the RBAC subjects, the admission policy's username, the
controller's flags) goes through the same helper as the object itself, so a renamed
release or a fullnameOverride can never leave a reference pointing at nothing.
*/}}

{{/* The prefix of every name; 40 characters leave room for the longest suffix. */}}
{{- define "dradriver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* DaemonSet, its ServiceAccount, ClusterRole and ClusterRoleBinding. */}}
{{- define "dradriver.plugin.name" -}}
{{- printf "%s-kubelet-plugin" (include "dradriver.fullname" .) -}}
{{- end -}}

{{/* The user the API server sees for the plugin's tokens; the admission policy keys on it. */}}
{{- define "dradriver.plugin.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "dradriver.plugin.name" .) -}}
{{- end -}}

{{/* Deployment, Service, ServiceAccount, ClusterRole and ClusterRoleBinding. */}}
{{- define "dradriver.controller.name" -}}
{{- printf "%s-controller" (include "dradriver.fullname" .) -}}
{{- end -}}

{{- define "dradriver.webhook.name" -}}
{{- printf "%s-admission" (include "dradriver.fullname" .) -}}
{{- end -}}

{{- define "dradriver.slicePolicy.name" -}}
{{- printf "%s-resourceslices-own-node" (include "dradriver.fullname" .) -}}
{{- end -}}

{{- define "dradriver.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "dradriver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component; `component` is set by the caller. */}}
{{- define "dradriver.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Settings the API server would accept and then silently drop or ignore are refused
here, at render time, with the reason.
*/}}
{{- define "dradriver.validate" -}}
{{- if and (eq .Values.migMode "dynamic") (not .Values.featureGates.DRAPartitionableDevices) -}}
{{- fail "migMode dynamic needs the DRAPartitionableDevices feature gate (alpha in 1.34) on kube-apiserver, kube-scheduler and kube-controller-manager; without it the API server drops the MIG partitions' counters. Enable the gate and set featureGates.DRAPartitionableDevices=true, or use migMode none or static." -}}
{{- end -}}
{{- if and .Values.extendedResourceClass.enabled (not .Values.featureGates.DRAExtendedResource) -}}
{{- fail "extendedResourceClass needs the DRAExtendedResource feature gate (alpha in 1.34); without it the API server drops extendedResourceName from the DeviceClass. Enable the gate and set featureGates.DRAExtendedResource=true." -}}
{{- end -}}
{{- if not (or (eq .Values.devices "nvml") (hasPrefix "fake:" .Values.devices)) -}}
{{- fail (printf "devices must be nvml or fake:<spec>, not %q" .Values.devices) -}}
{{- end -}}
{{- end -}}

{{- define "dradriver.claimStatusPolicy.name" -}}
{{- printf "%s-claim-status-own-node" (include "dradriver.fullname" .) -}}
{{- end -}}

{{- define "dradriver.controller.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "dradriver.controller.name" .) -}}
{{- end -}}

{{- define "dradriver.webhookPolicy.name" -}}
{{- printf "%s-webhook-cabundle-only" (include "dradriver.fullname" .) -}}
{{- end -}}
