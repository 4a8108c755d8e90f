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

{{/* Where a pod the chart renders runs: a values section's priorityClassName,
nodeSelector, tolerations, affinity and topologySpreadConstraints, as given, for the pod
spec. An empty affinity gets a preferred (never required) anti-affinity on
kubernetes.io/hostname among the component's pods: spread over nodes when possible, all
scheduled on a one-node cluster. A spread constraint without a labelSelector counts the
component's pods. Called with (dict "values" <section> "selector" <matchLabels map>). */}}
{{- define "segtxn.placement" -}}
{{- $v := .values -}}
{{- $select := .selector -}}
{{- with $v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if $v.affinity }}
  {{- toYaml $v.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- toYaml $select | nindent 14 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $select) }}
{{- end }}
  - {{ toYaml $c | nindent 4 | trim }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The SegtxnCluster's spec.brokers / TransactionCoordinator's spec fields for a
cluster.brokerPods / cluster.coordinatorPods section: only those given, so that the
operator's defaults (resources, the soft spread over nodes) hold for the rest. */}}
{{- define "segtxn.podKnobs" -}}
{{- range $key := list "resources" "priorityClassName" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" }}
{{- with index $ $key }}
{{ $key }}:{{ if kindIs "string" . }} {{ . | quote }}{{ else }}{{ toYaml . | nindent 2 }}{{ end }}
{{- end }}
{{- end }}
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

{{/* What the operator may do: read and patch its resources, create and patch (never
delete) their children. Kopf only GETs, POSTs and PATCHes (never PUT or DELETE);
segtxn/operator/kube.py GETs and server-side applies (a PATCH, which needs create too when
the child does not exist yet); children go with their owner through owner references.
Owner references with blockOwnerDeletion need update on the owner's finalizers
(OwnerReferencesPermissionEnforcement); only clusters and coordinators own children. */}}
{{- define "segtxn.operatorRules" -}}
- apiGroups: [segtxn.io]
  resources: [segtxnclusters, transactioncoordinators, scalabletopics]
  verbs: [get, list, watch, patch]
- apiGroups: [segtxn.io]
  resources: [segtxnclusters/status, transactioncoordinators/status, scalabletopics/status]
  verbs: [get, patch]
- apiGroups: [segtxn.io]
  resources: [segtxnclusters/finalizers, transactioncoordinators/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end -}}
