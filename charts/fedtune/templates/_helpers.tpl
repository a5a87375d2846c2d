{{/*
Names, labels, images and the security settings every pod shares.
*/}}

{{- define "fedtune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix; 63 characters at most because names become DNS labels. */}}
{{- define "fedtune.fullname" -}}
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

{{- define "fedtune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "fedtune.labels" -}}
helm.sh/chart: {{ include "fedtune.chart" . }}
app.kubernetes.io/name: {{ include "fedtune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fedtune
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "fedtune.selectorLabels" (list $ "mlflow") */}}
{{- define "fedtune.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "fedtune.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Labels of one component's resources: include "fedtune.componentLabels" (list $ "mlflow") */}}
{{- define "fedtune.componentLabels" -}}
{{ include "fedtune.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "fedtune.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The fedtune CPU image: by digest when one is pinned, else tagged with the package
   version unless image.tag overrides it. */}}
{{- define "fedtune.cpuImage" -}}
{{- if .Values.image.cpuDigest }}
{{- printf "%s/%s@%s" .Values.image.registry .Values.image.cpuRepository .Values.image.cpuDigest }}
{{- else }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.cpuRepository (include "fedtune.tag" .) }}
{{- end }}
{{- end }}

{{/* The GPU trainer image tenants run: by digest when one is pinned (the admission policy
   admits only that), else by tag. */}}
{{- define "fedtune.gpuImage" -}}
{{- if .Values.image.gpuDigest }}
{{- printf "%s/%s@%s" .Values.image.registry .Values.image.gpuRepository .Values.image.gpuDigest }}
{{- else }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.gpuRepository (include "fedtune.tag" .) }}
{{- end }}
{{- end }}

{{- define "fedtune.mlflowImage" -}}
{{- if .Values.mlflow.image.repository }}
{{- printf "%s:%s" .Values.mlflow.image.repository (default (include "fedtune.tag" .) .Values.mlflow.image.tag) }}
{{- else }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.cpuRepository (default (include "fedtune.tag" .) .Values.mlflow.image.tag) }}
{{- end }}
{{- end }}

{{- define "fedtune.mlflowImagePullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.mlflow.image.pullPolicy }}
{{- end }}

{{- define "fedtune.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fedtune.launcherServiceAccountName" -}}
{{- default (printf "%s-launcher" (include "fedtune.fullname" .)) .Values.launcher.serviceAccountName }}
{{- end }}

{{- define "fedtune.mlflowName" -}}
{{- printf "%s-mlflow" (include "fedtune.fullname" .) }}
{{- end }}

{{- define "fedtune.minioName" -}}
{{- printf "%s-minio" (include "fedtune.fullname" .) }}
{{- end }}

{{/* In-cluster URL of MLflow. */}}
{{- define "fedtune.mlflowUrl" -}}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "fedtune.mlflowName" .) .Release.Namespace (int .Values.mlflow.service.port) }}
{{- end }}

{{/* S3 endpoint URL of the exchange store as seen from inside the cluster; empty means AWS S3. */}}
{{- define "fedtune.s3Endpoint" -}}
{{- if eq .Values.objectStore.mode "minio" }}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "fedtune.minioName" .) .Release.Namespace (int .Values.objectStore.minio.port) }}
{{- else }}
{{- .Values.objectStore.external.endpoint }}
{{- end }}
{{- end }}

{{/* Namespace of a tenant entry: include "fedtune.tenantNamespace" (list $ $tenant) */}}
{{- define "fedtune.tenantNamespace" -}}
{{- $root := index . 0 }}
{{- $t := index . 1 }}
{{- default (printf "%s%s" $root.Values.tenantDefaults.namespacePrefix $t.name) $t.namespace }}
{{- end }}

{{- define "fedtune.tenantLabels" -}}
{{- $root := index . 0 }}
{{- $t := index . 1 -}}
{{ include "fedtune.componentLabels" (list $root "tenant") }}
fedtune.io/tenant: {{ $t.name }}
{{- end }}

{{/*
Pod-level security context shared by every pod: non-root with a fixed uid, the runtime's
default seccomp profile, and an fsGroup so the non-root user can write its volumes.
*/}}
{{- define "fedtune.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
fsGroup: {{ .Values.security.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security context: nothing to escalate, no capabilities, read-only root. */}}
{{- define "fedtune.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
With istio.enabled, every pod of the chart stays out of the mesh: tenant pods and the chart's
Jobs run without a sidecar (a Job whose sidecar never exits never completes), and under
Kubeflow's STRICT mTLS a meshed MinIO or MLflow would refuse their plaintext connections.
*/}}
{{- define "fedtune.istioOptOut" -}}
{{- if .Values.istio.enabled }}
{{- dict "sidecar.istio.io/inject" "false" | toYaml }}
{{- end }}
{{- end }}

{{/* Pod annotations of MinIO and MLflow: the shared ones, and the Istio opt-out. */}}
{{- define "fedtune.serverPodAnnotations" -}}
{{- $a := merge (fromYaml (include "fedtune.istioOptOut" .)) (deepCopy (default (dict) .Values.podAnnotations)) }}
{{- with $a }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* Pod annotations of Jobs and the test pod: the shared ones plus the Job-only ones. */}}
{{- define "fedtune.jobPodAnnotations" -}}
{{- $a := merge (fromYaml (include "fedtune.istioOptOut" .)) (deepCopy (default (dict) .Values.jobPodAnnotations)) (deepCopy (default (dict) .Values.podAnnotations)) }}
{{- with $a }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* S3 environment shared by every pod that talks to the exchange store. */}}
{{- define "fedtune.s3Env" -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.objectStore.existingSecret }}
      key: {{ .Values.objectStore.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.objectStore.existingSecret }}
      key: {{ .Values.objectStore.secretAccessKeyKey }}
- name: AWS_DEFAULT_REGION
  value: {{ .Values.objectStore.region | quote }}
{{- with (include "fedtune.s3Endpoint" .) }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ . | quote }}
- name: MLFLOW_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Host headers MLflow accepts (--allowed-hosts): every in-cluster name of its Service, with and
without the port, and localhost for `kubectl port-forward`. Setting the flag replaces MLflow's
defaults, so localhost has to be listed again.
*/}}
{{- define "fedtune.mlflowAllowedHosts" -}}
{{- $svc := include "fedtune.mlflowName" . }}
{{- $ns := .Release.Namespace }}
{{- $hosts := list }}
{{- range $name := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $hosts = append $hosts $name }}
{{- $hosts = append $hosts (printf "%s:%d" $name (int $.Values.mlflow.service.port)) }}
{{- end }}
{{- $hosts = concat $hosts (list "localhost" "localhost:*" "127.0.0.1" "127.0.0.1:*") .Values.mlflow.extraAllowedHosts }}
{{- join "," $hosts }}
{{- end }}

{{/* The ConfigMap of one shipped pipeline file: include "fedtune.pipelineConfigMapName" (list $ "files/pipelines/x.yaml") */}}
{{- define "fedtune.pipelineConfigMapName" -}}
{{- $root := index . 0 }}
{{- printf "%s-pipeline-%s" (include "fedtune.fullname" $root) (base (index . 1) | trimSuffix ".yaml") | trunc 253 }}
{{- end }}
