{{/* Names and labels shared by every template. */}}

{{- define "segtxn.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "segtxn.labels" -}}
app.kubernetes.io/name: segtxn
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "segtxn.selector" -}}
app.kubernetes.io/name: segtxn
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "segtxn.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "segtxn.etcdName" -}}
{{ include "segtxn.fullname" . }}-etcd
{{- end -}}

{{/* The chart etcd's client URL, as SegtxnCluster.spec.metadataStore.url wants it. */}}
{{- define "segtxn.etcdUrl" -}}
etcd://{{ include "segtxn.etcdName" . }}.{{ .Release.Namespace }}.svc:2379
{{- end -}}

{{/* What the operator may do: read and update its resources, and own their children. */}}
{{- define "segtxn.operatorRules" -}}
- apiGroups: [segtxn.io]
  resources: [segtxnclusters, transactioncoordinators, scalabletopics]
  verbs: [get, list, watch, patch, update]
- apiGroups: [segtxn.io]
  resources: [segtxnclusters/status, transactioncoordinators/status, scalabletopics/status]
  verbs: [get, patch, update]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end -}}
