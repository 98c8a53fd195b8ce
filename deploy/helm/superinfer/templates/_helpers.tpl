{{/* Names, labels and the figures derived from other values, each defined once here. */}}

{{- define "superinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "superinfer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "superinfer.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "superinfer.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Object names get a suffix: kept short enough for the 63-character limit. */}}
{{- define "superinfer.serverName" -}}
{{- printf "%s-server" (include "superinfer.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "superinfer.routerName" -}}
{{- printf "%s-router" (include "superinfer.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{- define "superinfer.routerServiceAccount" -}}
{{- default (include "superinfer.routerName" .) .Values.router.serviceAccount.name }}
{{- end }}

{{- define "superinfer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The server pods' identity. The router discovers replicas by exactly these labels (--selector),
and the Deployment, Service, PodDisruptionBudget and ServiceMonitor select by them too, so a
second release in the namespace is never mixed in.
*/}}
{{- define "superinfer.serverSelectorLabels" -}}
app.kubernetes.io/name: {{ include "superinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "superinfer.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "superinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{- define "superinfer.serverImage" -}}
{{- printf "%s:%s" .Values.server.image.repository (default .Chart.AppVersion .Values.server.image.tag) }}
{{- end }}

{{/*
SIGKILL comes after the preStop sleep, the server's drain, the launcher's 10 s for its
children (README, --graceful-termination-timeout-s) and a margin: the drain is never cut short.
*/}}
{{- define "superinfer.terminationGracePeriodSeconds" -}}
{{- $server := .Values.server }}
{{- add (int $server.preStopSleepSeconds) (int $server.gracefulTerminationTimeoutSeconds) 10 (int $server.terminationMarginSeconds) }}
{{- end }}

{{/* Startup probes allowed: the launcher's own start-up deadlines plus a margin, in probe periods. */}}
{{- define "superinfer.startupFailureThreshold" -}}
{{- $server := .Values.server }}
{{- $seconds := add (int $server.shardStartupTimeoutSeconds) (int $server.routerStartupTimeoutSeconds) (int $server.startupMarginSeconds) }}
{{- $period := int $server.probes.startupPeriodSeconds }}
{{- div (add $seconds $period -1) $period }}
{{- end }}

{{/* The Prometheus query KEDA scales on: this release's replicas' queues, summed. */}}
{{- define "superinfer.kedaQuery" -}}
{{- default (printf "sum(%s{namespace=%q,service=%q})" .Values.autoscaling.metricName .Release.Namespace (include "superinfer.serverName" .)) .Values.keda.query }}
{{- end }}

{{/* Settings that render valid objects but cannot work together are refused at render time. */}}
{{- define "superinfer.checkValues" -}}
{{- if and .Values.autoscaling.enabled .Values.keda.enabled }}
{{- fail "autoscaling.enabled and keda.enabled both scale the server: enable one" }}
{{- end }}
{{- if lt (int .Values.server.numShard) 1 }}
{{- fail "server.numShard must be at least 1" }}
{{- end }}
{{- if not (has .Values.server.modelCache.type (list "emptyDir" "hostPath" "pvc")) }}
{{- fail (printf "server.modelCache.type must be emptyDir, hostPath or pvc, got %q" .Values.server.modelCache.type) }}
{{- end }}
{{- end }}
