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

{{/* The servers' connection limits among cluster.* (the values given as the context) that
are set, as the SegtxnCluster's spec.brokers.settings and the TransactionCoordinator's spec
take them; null: absent (the servers' defaults). A YAML number reaches a template as a float:
toJson prints it whole (1000000, not 1e+06, which the CRD would refuse as a string). */}}
{{- define "segtxn.connectionLimits" -}}
{{- range $key := list "maxConnections" "maxConnectionsPerIp" "idleTimeoutSeconds" }}
{{- with index $ $key }}
{{ $key }}: {{ toJson . }}
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

{{/* The namespaces a namespaced operator watches (a YAML list): operator.watchNamespaces,
or else the release's own. */}}
{{- define "segtxn.watchedNamespaces" -}}
{{- toYaml (default (list .Release.Namespace) .Values.operator.watchNamespaces) -}}
{{- end -}}

{{/* What the operator may do, and no more: exactly the requests it sends
(segtxn/operator/kube.py, CALLS, which refuses any other) and those Kopf sends, checked by
tests/operator/test_rbac.py against what the operator sends to an emulated API server.
Kopf lists, watches and patches the four resources (their status through /status) and
creates events; it never GETs one object, PUTs or DELETEs. kube.py GETs the kinds it reads,
server-side applies children (a PATCH, which needs create too when the child does not exist
yet; a VerificationRun's driver is a Pod), patches a ScalableTopic's status during a long
resharding and a VerificationRun's as it runs, and evicts a broker's pod in a roll; it
deletes nothing (children go with their owner through owner references).
Owner references with blockOwnerDeletion need update on the owner's finalizers
(OwnerReferencesPermissionEnforcement); clusters, coordinators and runs own children. The
peering objects are the caller's: namespaced ones in a Role, cluster ones cluster-wide;
Kopf lists, watches and patches them, and kube.py GETs the one it needs once at start-up
(segtxn/operator/peering.py: a WARNING when it is missing). */}}
{{- define "segtxn.operatorRules" -}}
- apiGroups: [segtxn.io]
  resources: [segtxnclusters, transactioncoordinators]
  verbs: [get, list, watch, patch]
- apiGroups: [segtxn.io]
  resources: [scalabletopics, verificationruns]
  verbs: [list, watch, patch]
- apiGroups: [segtxn.io]
  resources: [segtxnclusters/status, transactioncoordinators/status, scalabletopics/status, verificationruns/status]
  verbs: [patch]
- apiGroups: [segtxn.io]
  resources: [segtxnclusters/finalizers, transactioncoordinators/finalizers, verificationruns/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [cert-manager.io]
  resources: [certificates, issuers]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
