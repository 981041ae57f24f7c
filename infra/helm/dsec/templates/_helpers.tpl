{{- define "dsec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dsec.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dsec.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dsec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dsec
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "stream-jobs") */}}
{{- define "dsec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dsec.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dsec.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dsec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dsec.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dsec.bootstrap" -}}
{{- with .Values.kafka.strimzi -}}
{{- if .clusterName -}}
{{- printf "%s-kafka-bootstrap.%s.svc:%v" .clusterName (default $.Release.Namespace .namespace) .port -}}
{{- else -}}
{{- required "kafka.bootstrap (or kafka.strimzi.clusterName) is required" $.Values.kafka.bootstrap -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key holding one value: (dict "root" $ "existing" .existingSecret "existingKey" .existingSecretKey "key" "signing-key") */}}
{{- define "dsec.secretRef" -}}
name: {{ default (include "dsec.fullname" .root) .existing }}
key: {{ ternary .existingKey .key (not (empty .existing)) }}
{{- end -}}

{{- define "dsec.kafkaTlsSecret" -}}
{{- default (printf "%s-kafka-tls" (include "dsec.fullname" .)) .Values.kafka.ssl.existingSecret -}}
{{- end -}}

{{/* Environment shared by every dsec container. */}}
{{- define "dsec.env" -}}
- name: DSEC_BOOTSTRAP
  value: {{ include "dsec.bootstrap" . | quote }}
- name: DSEC_TOPIC_PREFIX
  value: {{ .Values.kafka.topicPrefix | quote }}
- name: DSEC_REPLICATION_FACTOR
  value: {{ .Values.kafka.replicationFactor | quote }}
- name: DSEC_CLICKHOUSE_DSN
  valueFrom:
    secretKeyRef:
      {{- include "dsec.secretRef" (dict "root" . "existing" .Values.clickhouse.existingSecret "existingKey" .Values.clickhouse.existingSecretKey "key" "clickhouse-dsn") | nindent 6 }}
- name: DSEC_CLICKHOUSE_TTL_DAYS
  value: {{ .Values.clickhouse.ttlDays | quote }}
- name: DSEC_SIGNING_MODE
  value: hmac-dev
- name: DSEC_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      {{- include "dsec.secretRef" (dict "root" . "existing" .Values.signingKey.existingSecret "existingKey" .Values.signingKey.existingSecretKey "key" "signing-key") | nindent 6 }}
- name: DSEC_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.sasl }}
{{- if .mechanism }}
- name: DSEC_KAFKA_SASL_MECHANISM
  value: {{ .mechanism | quote }}
{{- if not $.Values.kafka.users.enabled }}
- name: DSEC_KAFKA_SASL_USERNAME
  value: {{ required "kafka.sasl.username is required with a SASL mechanism" .username | quote }}
- name: DSEC_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      {{- include "dsec.secretRef" (dict "root" $ "existing" .existingSecret "existingKey" .existingSecretKey "key" "kafka-sasl-password") | nindent 6 }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.kafka.ssl.enabled }}
- name: DSEC_KAFKA_SSL_CA_LOCATION
  value: /etc/dsec/kafka-tls/ca.crt
{{- if or .Values.kafka.ssl.certKey .Values.kafka.ssl.cert }}
- name: DSEC_KAFKA_SSL_CERTIFICATE_LOCATION
  value: /etc/dsec/kafka-tls/tls.crt
- name: DSEC_KAFKA_SSL_KEY_LOCATION
  value: /etc/dsec/kafka-tls/tls.key
{{- end }}
{{- end }}
- name: DSEC_DATA_DIR
  value: /var/lib/dsec
- name: DSEC_METRICS_HOST
  value: 0.0.0.0
- name: DSEC_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* With kafka.users.enabled, the Kafka user of one dsec part: (dict "root" $ "part" "sink") */}}
{{- define "dsec.kafkaUserEnv" -}}
{{- $users := .root.Values.kafka.users -}}
{{- $_ := required "kafka.sasl.mechanism is required with kafka.users.enabled" .root.Values.kafka.sasl.mechanism -}}
{{- $name := printf "%s%s" $users.namePrefix .part -}}
- name: DSEC_KAFKA_SASL_USERNAME
  value: {{ $name | quote }}
- name: DSEC_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $name | quote }}
      key: {{ $users.passwordKey | quote }}
{{- end -}}

{{- define "dsec.volumeMounts" -}}
- name: data
  mountPath: /var/lib/dsec
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.ssl.enabled }}
- name: kafka-tls
  mountPath: /etc/dsec/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dsec.volumes" -}}
- name: data
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.ssl.enabled }}
- name: kafka-tls
  secret:
    secretName: {{ include "dsec.kafkaTlsSecret" . }}
    {{- $existing := not (empty .Values.kafka.ssl.existingSecret) }}
    items:
      - {key: {{ ternary .Values.kafka.ssl.caKey "ca.crt" $existing }}, path: ca.crt}
      {{- if or .Values.kafka.ssl.certKey .Values.kafka.ssl.cert }}
      - {key: {{ ternary .Values.kafka.ssl.certKey "tls.crt" $existing }}, path: tls.crt}
      - {key: {{ ternary .Values.kafka.ssl.keyKey "tls.key" $existing }}, path: tls.key}
      {{- end }}
{{- end }}
{{- end -}}

{{- define "dsec.podAnnotations" -}}
checksum/config: {{ toJson (list .Values.kafka .Values.clickhouse .Values.signingKey .Values.gateway.token .Values.extraEnv) | sha256sum }}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dsec.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet: {path: /healthz, port: metrics}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end -}}

{{/* A dsec service as a Deployment: (dict "root" $ "component" "sink" "values" .Values.sink "args" (list ...)) */}}
{{- define "dsec.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "dsec.fullname" $root }}-{{ .component }}
  labels:
    {{- include "dsec.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      {{- include "dsec.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "dsec.selectorLabels" (dict "root" $root "component" .component) | nindent 8 }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- include "dsec.podAnnotations" $root | nindent 8 }}
    spec:
      serviceAccountName: {{ include "dsec.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: 60
      {{- if and .runsInit $root.Values.init.enabled }}
      initContainers:
        {{- include "dsec.initContainer" $root | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "dsec.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          env:
            {{- include "dsec.env" $root | nindent 12 }}
            {{- if $root.Values.kafka.users.enabled }}
            {{- include "dsec.kafkaUserEnv" (dict "root" $root "part" (ternary "gateway" .component (eq .component "ingest-gateway"))) | nindent 12 }}
            {{- end }}
            {{- with .extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - {name: metrics, containerPort: {{ $root.Values.metrics.port }}, protocol: TCP}
            {{- with .extraPorts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- include "dsec.probes" $root | nindent 10 }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "dsec.volumeMounts" $root | nindent 12 }}
      volumes:
        {{- include "dsec.volumes" $root | nindent 8 }}
      {{- with .values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* A headless Service over one component's metrics port, for ServiceMonitors. */}}
{{- define "dsec.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "dsec.fullname" .root }}-{{ .component }}-metrics
  labels:
    {{- include "dsec.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    dsec.io/metrics: "true"
spec:
  clusterIP: None
  selector:
    {{- include "dsec.selectorLabels" . | nindent 4 }}
  ports:
    - {name: metrics, port: {{ .root.Values.metrics.port }}, targetPort: metrics, protocol: TCP}
{{- end -}}

{{/* `dsec init` before a stack service starts: whichever pod comes first makes the topics
with the chosen partitions and replication factor, and the tables. */}}
{{- define "dsec.initContainer" -}}
- name: init
  image: {{ include "dsec.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - init
    - --bootstrap
    - $(DSEC_BOOTSTRAP)
    - --partitions
    - {{ .Values.kafka.partitions | quote }}
    - --replication-factor
    - {{ .Values.kafka.replicationFactor | quote }}
    - --wait-s
    - {{ .Values.init.waitSeconds | quote }}
  env:
    {{- include "dsec.env" . | nindent 4 }}
    {{- if .Values.kafka.users.enabled }}
    {{- include "dsec.kafkaUserEnv" (dict "root" . "part" "init") | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml .Values.init.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "dsec.volumeMounts" . | nindent 4 }}
{{- end -}}
