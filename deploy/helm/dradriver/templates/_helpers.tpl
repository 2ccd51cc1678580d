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

{{/* One plugin DaemonSet's name: the plugin's, and the node group's after it. */}}
{{- define "dradriver.plugin.daemonset" -}}
{{- $base := include "dradriver.plugin.name" .root -}}
{{- if .group -}}{{- printf "%s-%s" $base .group -}}{{- else -}}{{- $base -}}{{- end -}}
{{- end -}}

{{/* Every plugin DaemonSet's name, comma-separated (the plugin's Role names them). */}}
{{- define "dradriver.plugin.daemonsets" -}}
{{- $root := . -}}
{{- $names := list -}}
{{- range $group := (.Values.nodeGroups | default (list (dict))) -}}
{{- $names = append $names (include "dradriver.plugin.daemonset" (dict "root" $root "group" ($group.name | default ""))) -}}
{{- end -}}
{{- join "," $names -}}
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

{{/*
The driver's name and its GPU and MIG DeviceClasses' names: NVIDIA's (gpu.nvidia.com,
mig.nvidia.com) with nvidiaCompatible, so that manifests written for NVIDIA's DRA driver
(its classes, its config's driver, the attribute domain in its CEL) run unchanged.
*/}}
{{- define "dradriver.driverName" -}}
{{- ternary "gpu.nvidia.com" .Values.driverName (.Values.nvidiaCompatible | default false) -}}
{{- end -}}

{{- define "dradriver.class.gpu" -}}
{{- ternary "gpu.nvidia.com" .Values.deviceClasses.gpu (.Values.nvidiaCompatible | default false) -}}
{{- end -}}

{{- define "dradriver.class.mig" -}}
{{- ternary "mig.nvidia.com" .Values.deviceClasses.mig (.Values.nvidiaCompatible | default false) -}}
{{- end -}}

{{/*
NVIDIA's classes for what dradriver does not do (a CEL list): with nvidiaCompatible the
webhook refuses claims naming one (dradriver/controller/validate.py names the same).
*/}}
{{- define "dradriver.nvidiaClassesNotServed" -}}
["vfio.gpu.nvidia.com", "compute-domain-default-channel.nvidia.com", "compute-domain-channel.nvidia.com", "compute-domain-daemon.nvidia.com", "imex.nvidia.com"]
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
{{- if and .Values.nvidiaCompatible (not (has .Values.driverName (list "gpu.dradriver.io" "gpu.nvidia.com"))) -}}
{{- fail (printf "nvidiaCompatible installs the driver as gpu.nvidia.com, NVIDIA's name; driverName %q says otherwise: leave driverName unset, or nvidiaCompatible false" .Values.driverName) -}}
{{- end -}}
{{- if and .Values.extendedResourceClass.enabled (ne (include "dradriver.gateOn" (dict "root" . "gate" "DRAExtendedResource")) "true") -}}
{{- fail "extendedResourceClass needs the DRAExtendedResource feature gate (alpha, off by default on Kubernetes 1.34 and 1.35; on from 1.36); without it the API server drops extendedResourceName from the DeviceClass. Enable the gate and set featureGates.DRAExtendedResource=true." -}}
{{- end -}}
{{- $names := list -}}
{{- range $i, $group := .Values.nodeGroups -}}
{{- if not $group.name -}}
{{- fail (printf "nodeGroups[%d] needs a name (a DNS label: it names the group's DaemonSet)" $i) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?$" $group.name) -}}
{{- fail (printf "nodeGroups[%d].name %q must be a DNS label of at most 16 characters (it is appended to the DaemonSet's name)" $i $group.name) -}}
{{- end -}}
{{- if has $group.name $names -}}
{{- fail (printf "nodeGroups: the name %q is used twice" $group.name) -}}
{{- end -}}
{{- $names = append $names $group.name -}}
{{- if not $group.nodeSelector -}}
{{- fail (printf "nodeGroups[%d] (%s) needs a nodeSelector: without one it would run on every node, beside the other groups' plugins" $i $group.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the cluster has the gate on: as featureGates says, or where it says nothing,
as the Kubernetes line's default (dradriver/k8s/lines.py: the gates this chart checks are
off by default on 1.34 and 1.35 and on from 1.36). `root`, `gate`.
*/}}
{{- define "dradriver.gateOn" -}}
{{- $set := index .root.Values.featureGates .gate -}}
{{- if kindIs "bool" $set -}}
{{- $set -}}
{{- else -}}
{{- semverCompare ">=1.36.0-0" .root.Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{/*
The settings of one DaemonSet (the top-level values, or a node group's over them).
`where` names them in a message: "" at the top level, " (nodeGroups <name>)" in a group.
*/}}
{{- define "dradriver.validateGroup" -}}
{{- $g := .g -}}
{{- $where := ternary "" (printf " (nodeGroups %s)" $g.name) (empty $g.name) -}}
{{- if not (or (eq $g.devices "nvml") (hasPrefix "fake:" $g.devices)) -}}
{{- fail (printf "devices%s must be nvml or fake:<spec>, not %q" $where $g.devices) -}}
{{- end -}}
{{- if not (has $g.migMode (list "none" "static" "dynamic")) -}}
{{- fail (printf "migMode%s must be none, static or dynamic, not %q" $where $g.migMode) -}}
{{- end -}}
{{- if and (eq $g.migMode "dynamic") (ne (include "dradriver.gateOn" (dict "root" .root "gate" "DRAPartitionableDevices")) "true") -}}
{{- fail (printf "migMode dynamic%s needs the DRAPartitionableDevices feature gate (alpha, off by default on Kubernetes 1.34 and 1.35; on from 1.36) on kube-apiserver, kube-scheduler and kube-controller-manager; without it the API server drops the MIG partitions' counters. Enable the gate and set featureGates.DRAPartitionableDevices=true, or use migMode none or static." $where) -}}
{{- end -}}
{{- if and (eq $g.migMode "dynamic") (ne $g.consumableCapacity "off") -}}
{{- fail (printf "consumableCapacity %s%s cannot be combined with migMode dynamic: a GPU is either shared by capacity or carved into MIG partitions. Set one of them per node group." $g.consumableCapacity $where) -}}
{{- end -}}
{{- end -}}

{{- define "dradriver.nodeLabelPolicy.name" -}}
{{- printf "%s-node-label-own-node" (include "dradriver.fullname" .) -}}
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

{{/* Whether a group's plugin labels its Node with its NVLink domain: the value where
     set, else where the group runs IMEX channels (the GB200 / GH200 nodes, where a
     fabric clique exists). "true" or "". Takes (dict "root" $ "imex" <bool>). */}}
{{- define "dradriver.nodeLabel" -}}
{{- $v := .root.Values.kubeletPlugin.nvlinkDomainLabel -}}
{{- if kindIs "invalid" $v -}}{{- if .imex -}}true{{- end -}}{{- else if $v -}}true{{- end -}}
{{- end -}}

{{/* Whether any group's plugin labels its Node: then, and only then, it may patch nodes. */}}
{{- define "dradriver.anyNodeLabel" -}}
{{- $root := . -}}
{{- $any := "" -}}
{{- range $group := (.Values.nodeGroups | default (list (dict))) -}}
{{- $imex := and $root.Values.computeDomains.enabled (ternary $group.imexChannels $root.Values.computeDomains.imexChannels (hasKey $group "imexChannels")) -}}
{{- if include "dradriver.nodeLabel" (dict "root" $root "imex" $imex) -}}{{- $any = "true" -}}{{- end -}}
{{- end -}}
{{- $any -}}
{{- end -}}

{{- define "dradriver.templatePolicy.name" -}}
{{- printf "%s-controller-domain-templates-only" (include "dradriver.fullname" .) -}}
{{- end -}}

{{- define "dradriver.daemonPolicy.name" -}}
{{- printf "%s-daemon-pods-own-node" (include "dradriver.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
"true" where some node group's plugin runs on real GPUs (devices: nvml): only there may
its daemon pods be privileged (the driver's daemons open the GPUs' device nodes).
*/}}
{{- define "dradriver.anyNvml" -}}
{{- $any := eq .Values.devices "nvml" -}}
{{- range .Values.nodeGroups }}{{ if eq (.devices | default "") "nvml" }}{{ $any = true }}{{ end }}{{ end -}}
{{- if $any }}true{{ end -}}
{{- end -}}
