{{/* Chart name. */}}
{{- define "outbox-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release already contains it. */}}
{{- define "outbox-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Common labels. */}}
{{- define "outbox-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "outbox-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "outbox-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "outbox-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Operator image. */}}
{{- define "outbox-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Default relay image. */}}
{{- define "outbox-operator.relayImage" -}}
{{- printf "%s:%s" (default .Values.image.repository .Values.relay.repository) (default (default .Chart.AppVersion .Values.image.tag) .Values.relay.tag) }}
{{- end }}
