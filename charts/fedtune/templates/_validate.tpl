{{/*
Cross-field checks the JSON schema cannot express. Every problem is collected first and the
chart fails once, listing all of them with their fixes, so a user corrects the values file in
one pass instead of one `helm install` per mistake. Rendered from templates/validate.yaml.
*/}}
{{- define "fedtune.validate" -}}
{{- $errors := list }}
{{- $v := .Values }}

{{- /* Object store credentials: there is no default password, so a Secret must be named. */}}
{{- if not $v.objectStore.existingSecret }}
{{- $errors = append $errors "objectStore.existingSecret is empty: the chart ships no default S3/MinIO password. Fix: create a Secret with keys access-key-id and secret-access-key in the release namespace (kubectl create secret generic fedtune-s3 --from-literal=access-key-id=... --from-literal=secret-access-key=...) and set objectStore.existingSecret=fedtune-s3." }}
{{- end }}
{{- if and (eq $v.objectStore.mode "external") (gt (len $v.tenants) 0) (empty $v.objectStore.external.cidrs) }}
{{- $errors = append $errors "objectStore.external.cidrs is empty while objectStore.mode=external and tenants are defined: tenant pods could not reach the exchange store through their egress NetworkPolicy. Fix: list the CIDRs of objectStore.external.endpoint (e.g. [\"52.218.0.0/17\"])." }}
{{- end }}
{{- if eq $v.objectStore.exchangeBucket $v.objectStore.providerBucket }}
{{- $errors = append $errors (printf "objectStore.exchangeBucket and objectStore.providerBucket are both %q: the provider-private store (server state, summaries, exports) must not share the bucket tenants get pre-signed URLs into. Fix: use two different buckets." $v.objectStore.exchangeBucket) }}
{{- end }}
{{- if eq $v.objectStore.exchangeBucket $v.objectStore.artifactsBucket }}
{{- $errors = append $errors (printf "objectStore.exchangeBucket and objectStore.artifactsBucket are both %q: tenants get pre-signed URLs into the exchange bucket, which must not hold MLflow's artifacts. Fix: use two different buckets." $v.objectStore.exchangeBucket) }}
{{- end }}

{{- /* Tenant admission: the policy pins the trainer image by digest. */}}
{{- if and $v.tenantAdmission.enabled (gt (len $v.tenants) 0) (not $v.image.gpuDigest) }}
{{- $errors = append $errors "image.gpuDigest is empty while tenantAdmission.enabled=true and tenants are defined: each tenant's admission policy admits only the trainer image pinned by digest. Fix: set image.gpuDigest to the sha256 digest of the fedtune GPU image (docker buildx imagetools inspect IMAGE), or tenantAdmission.enabled=false." }}
{{- end }}

{{- /* The run's account reads Secrets by name only: an empty resourceNames list would mean every Secret. */}}
{{- if or (empty $v.launcher.kfp.artifactSecretNames) (empty $v.launcher.kfp.launcherConfigMap) }}
{{- $errors = append $errors "launcher.kfp.artifactSecretNames or launcher.kfp.launcherConfigMap is empty: the run's ServiceAccount may read KFP's settings and artifact Secrets by name only, and a Role with no names would grant every Secret of the namespace. Fix: name them (defaults: kfp-launcher, [mlpipeline-minio-artifact])." }}
{{- end }}

{{- /* MLflow backend. */}}
{{- if eq $v.mlflow.backend.type "postgresql" }}
{{- if not $v.mlflow.backend.postgresql.existingSecret }}
{{- $errors = append $errors "mlflow.backend.postgresql.existingSecret is empty while mlflow.backend.type=postgresql. Fix: create a Secret whose key uri holds postgresql://USER:PASSWORD@HOST:5432/mlflow and set mlflow.backend.postgresql.existingSecret to its name." }}
{{- end }}
{{- else if gt (int $v.mlflow.replicas) 1 }}
{{- $errors = append $errors (printf "mlflow.replicas is %d but mlflow.backend.type=sqlite: one SQLite file on a ReadWriteOnce volume cannot be shared by several servers. Fix: set mlflow.replicas=1, or use mlflow.backend.type=postgresql." (int $v.mlflow.replicas)) }}
{{- end }}
{{- if and $v.mlflow.auth.enabled (not $v.mlflow.auth.pipelineSecret) }}
{{- $errors = append $errors "mlflow.auth.enabled=true but mlflow.auth.pipelineSecret is empty: pipeline pods would get 401 from MLflow. Fix: create a Secret with keys username and password (kubectl create secret generic fedtune-mlflow-pipeline --from-literal=username=fedtune-pipeline --from-literal=password=$(openssl rand -hex 24)) and set mlflow.auth.pipelineSecret=fedtune-mlflow-pipeline." }}
{{- end }}
{{- if and $v.mlflow.auth.enabled (not $v.mlflow.auth.existingSecret) }}
{{- $errors = append $errors "mlflow.auth.enabled=true but mlflow.auth.existingSecret is empty: MLflow has no default admin password. Fix: create a Secret with keys admin-password and flask-secret-key (kubectl create secret generic mlflow-auth --from-literal=admin-password=... --from-literal=flask-secret-key=$(openssl rand -hex 32)) and set mlflow.auth.existingSecret." }}
{{- end }}

{{- /* Pipelines: files present means an upload Job, which needs somewhere to upload to. */}}
{{- $pipelineFiles := .Files.Glob "files/pipelines/*.yaml" }}
{{- if and $v.pipelines.upload (gt (len $pipelineFiles) 0) }}
{{- if not $v.pipelines.kfpApiUrl }}
{{- $errors = append $errors "pipelines.kfpApiUrl is empty while pipelines.upload=true and files/pipelines/ holds compiled pipelines. Fix: set pipelines.kfpApiUrl (e.g. http://ml-pipeline.kubeflow.svc.cluster.local:8888) or pipelines.upload=false." }}
{{- end }}
{{- $size := 0 }}
{{- range $path, $_ := $pipelineFiles }}
{{- $size = add $size (len ($.Files.Get $path)) }}
{{- end }}
{{- if gt $size 1000000 }}
{{- $errors = append $errors (printf "files/pipelines/ holds %d bytes of compiled pipelines, more than a ConfigMap can carry (1 MiB). Fix: ship fewer pipelines in the chart and upload the rest with `fedtune compile` and the KFP UI." $size) }}
{{- end }}
{{- end }}

{{- /* Tenants: unique names and namespaces, and namespaces that are not the provider's. */}}
{{- $names := dict }}
{{- $namespaces := dict }}
{{- range $i, $t := $v.tenants }}
{{- $ns := include "fedtune.tenantNamespace" (list $ $t) }}
{{- if hasKey $names $t.name }}
{{- $errors = append $errors (printf "tenants[%d].name %q is used twice. Fix: give every tenant its own name." $i $t.name) }}
{{- end }}
{{- $_ := set $names $t.name true }}
{{- if hasKey $namespaces $ns }}
{{- $errors = append $errors (printf "tenants[%d] (%s) uses namespace %q, already used by tenant %s: tenants must be isolated from each other. Fix: give each tenant its own namespace." $i $t.name $ns (get $namespaces $ns)) }}
{{- end }}
{{- $_ := set $namespaces $ns $t.name }}
{{- if gt (len $ns) 63 }}
{{- $errors = append $errors (printf "tenants[%d] (%s) namespace %q is longer than 63 characters. Fix: shorten the name or set tenants[%d].namespace." $i $t.name $ns $i) }}
{{- end }}
{{- if eq $ns $.Release.Namespace }}
{{- $errors = append $errors (printf "tenants[%d] (%s) namespace %q is the provider's (release) namespace: the tenant would share MLflow's and the launcher's namespace. Fix: set tenants[%d].namespace to a namespace of its own." $i $t.name $ns $i) }}
{{- end }}
{{- if has $ns (list "default" "kube-system" "kube-public" "kube-node-lease") }}
{{- $errors = append $errors (printf "tenants[%d] (%s) namespace %q is a system namespace; the chart would put a default-deny policy into it. Fix: choose another tenants[%d].namespace." $i $t.name $ns $i) }}
{{- end }}
{{- if and (gt (int $t.quota.gpu) 0) (empty $t.nodeSelector) (empty $t.tolerations) }}
{{- $errors = append $errors (printf "tenants[%d] (%s) has quota.gpu=%d but neither nodeSelector nor tolerations: its GPU pods would not be steered to GPU nodes (which are usually tainted). Fix: set tenants[%d].nodeSelector (e.g. {nvidia.com/gpu.present: \"true\"}) and/or tolerations, or quota.gpu=0." $i $t.name (int $t.quota.gpu) $i) }}
{{- end }}
{{- end }}

{{- /* Serving. */}}
{{- if $v.serving.enabled }}
{{- if not $v.serving.storageUri }}
{{- $errors = append $errors "serving.enabled=true but serving.storageUri is empty. Fix: set it to the promoted model's location, e.g. s3://fedtune-mlflow/artifacts/1/models/m-0123/artifacts (the MLflow UI shows it on the registered model version)." }}
{{- end }}
{{- if $v.serving.lora.enabled }}
{{- if ne $v.serving.architecture "llama" }}
{{- $errors = append $errors (printf "serving.lora.enabled=true with serving.architecture=%q: vLLM serves LoRA adapters for Llama-shaped models only. Fix: merge the adapter into the base model and set serving.lora.enabled=false, or serve a Llama-architecture base." $v.serving.architecture) }}
{{- end }}
{{- if empty $v.serving.lora.modules }}
{{- $errors = append $errors "serving.lora.enabled=true but serving.lora.modules is empty. Fix: list the adapters, e.g. [{name: fedtune-adapter, path: /mnt/models/adapter}]." }}
{{- end }}
{{- end }}
{{- end }}

{{- if $errors }}
{{- $lines := list }}
{{- range $i, $e := $errors }}
{{- $lines = append $lines (printf "  %d. %s" (add1 $i) $e) }}
{{- end }}
{{- fail (printf "\n\nfedtune: %d problem(s) in the values:\n%s\n" (len $errors) (join "\n" $lines)) }}
{{- end }}
{{- end }}
