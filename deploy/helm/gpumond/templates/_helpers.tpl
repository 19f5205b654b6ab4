{{/* Names, labels and the checks that span several values (values.schema.json checks each value alone). */}}

{{- define "gpumond.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpumond.fullname" -}}
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

{{/* Object names: fullname plus a component suffix, within the 63 characters of a DNS label. */}}
{{- define "gpumond.agentName" -}}
{{- printf "%s-agent" (include "gpumond.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}
{{- define "gpumond.rulesName" -}}
{{- printf "%s-rules" (include "gpumond.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}
{{- define "gpumond.relayName" -}}
{{- printf "%s-relay" (include "gpumond.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "gpumond.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumond.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpumond.labels" -}}
{{ include "gpumond.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpumond
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* repository:tag, and @digest when one is pinned (the runtime pulls by digest; the tag stays for people). */}}
{{- define "gpumond.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{- define "gpumond.secretName" -}}
{{- default (printf "%s-secrets" (include "gpumond.fullname" . | trunc 55 | trimSuffix "-")) .Values.secret.existingSecret -}}
{{- end -}}

{{/* The chart creates the Secret unless an existing one is named, or nothing would read it. */}}
{{- define "gpumond.createSecret" -}}
{{- $s := .Values.secret -}}
{{- if and (not $s.existingSecret) (or .Values.rules.enabled $s.slackWebhookUrl $s.pagerdutyRoutingKey (and .Values.agent.relay.nodeToken $s.rulesTokens)) -}}true{{- end -}}
{{- end -}}

{{/* The push tokens the created Secret holds: secret.rulesTokens, else the token this release generated
     before (kept across upgrades), else a new random one. */}}
{{- define "gpumond.rulesTokens" -}}
{{- if .Values.secret.rulesTokens -}}
{{- join "," .Values.secret.rulesTokens -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "gpumond.secretName" .) -}}
{{- $key := .Values.secret.keys.rulesTokens -}}
{{- if and $old $old.data (hasKey $old.data $key) -}}
{{- index $old.data $key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Slack / PagerDuty environment from the Secret; optional keys, so an existing Secret may hold only some. */}}
{{- define "gpumond.alertingEnv" -}}
- name: GPUMOND_SLACK_WEBHOOK_URL
  valueFrom:
    secretKeyRef: {name: {{ include "gpumond.secretName" . }}, key: {{ .Values.secret.keys.slackWebhookUrl }}, optional: true}
- name: GPUMOND_PAGERDUTY_ROUTING_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "gpumond.secretName" . }}, key: {{ .Values.secret.keys.pagerdutyRoutingKey }}, optional: true}
{{- end -}}

{{/* The agent's agent.yaml: the operator's config with the keys the chart owns set, and cross-value checks. */}}
{{- define "gpumond.agentConfig" -}}
{{- $cfg := deepCopy (default dict .Values.agent.config) -}}
{{- range $key := list "listen" "node_name" "state_dir" -}}
{{- if hasKey $cfg $key -}}
{{- fail (printf "agent.config.%s: set by the chart (agent.port, the node's name, agent.stateHostPath); remove it from agent.config" $key) -}}
{{- end -}}
{{- end -}}
{{- $policy := deepCopy (default dict $cfg.policy) -}}
{{- if .Values.agent.readOnly -}}
{{- if eq (toString (default "" $policy.mode)) "enforce" -}}
{{- fail "agent.config.policy.mode: enforce needs CAP_SYS_ADMIN, which agent.readOnly: true drops; set it to dry_run or off, or agent.readOnly: false" -}}
{{- end -}}
{{- end -}}
{{- /* dry_run unless the operator writes agent.config.policy.mode: enforce: nothing acts on a GPU until then. */ -}}
{{- if not $policy.mode -}}{{- $_ := set $policy "mode" "dry_run" -}}{{- end -}}
{{- $_ := set $cfg "policy" $policy -}}
{{- include "gpumond.tlsOwnsWebConfig" (dict "cfg" $cfg "component" "agent" "root" .) -}}
{{- include "gpumond.relayConfig" (dict "cfg" $cfg "root" .) -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.agent.port)) -}}
{{- $_ := set $cfg "state_dir" "/var/lib/gpumond" -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* agent.yaml's relay section: the operator's agent.config.relay, its upstream defaulting to this release's rules
     service (the shard template and count when sharded, https and the mounted CA with tls.enabled). Its listen
     address is the pod's own, given by --relay-listen (the DaemonSet), so it is refused here. */}}
{{- define "gpumond.relayConfig" -}}
{{- $root := .root -}}
{{- $r := $root.Values.agent.relay -}}
{{- if not $r.enabled -}}
{{- if hasKey .cfg "relay" -}}
{{- fail "agent.config.relay: agent.relay.enabled is false, so no pod could reach the relay; set agent.relay.enabled: true or remove agent.config.relay" -}}
{{- end -}}
{{- else -}}
{{- if eq (int $r.port) (int $root.Values.agent.port) -}}
{{- fail (printf "agent.relay.port: %d is agent.port as well (the metrics listener); give the relay its own port, e.g. 9482" (int $r.port)) -}}
{{- end -}}
{{- $relay := deepCopy (default dict .cfg.relay) -}}
{{- if hasKey $relay "listen" -}}
{{- fail (printf "agent.config.relay.listen: set by the chart (the pod's address, port agent.relay.port %d); remove it from agent.config.relay" (int $r.port)) -}}
{{- end -}}
{{- if not $relay.upstream -}}
{{- if not $root.Values.rules.enabled -}}
{{- fail "agent.config.relay.upstream: rules.enabled is false, so the relay has no rules service to default to; give its URL, or set agent.relay.enabled: false" -}}
{{- end -}}
{{- $t := $root.Values.tls -}}
{{- $scheme := ternary "https" "http" $t.enabled -}}
{{- $name := include "gpumond.rulesName" $root -}}
{{- if $root.Values.rules.sharded -}}
{{- $_ := set $relay "upstream" (printf "%s://%s-{shard}.%s-shards.%s.svc:%d" $scheme $name $name $root.Release.Namespace (int $root.Values.rules.port)) -}}
{{- $_ := set $relay "shards" (int $root.Values.rules.replicas) -}}
{{- else -}}
{{- $_ := set $relay "upstream" (printf "%s://%s.%s.svc:%d" $scheme $name $root.Release.Namespace (int $root.Values.rules.port)) -}}
{{- end -}}
{{- /* The chart's rules service: trust the CA of the mounted Secret (one cert-manager issuer for both), and
       present the agent's certificate where the service asks for one. */ -}}
{{- if and $t.enabled (not $relay.tls_config) -}}
{{- $tlsConfig := dict "ca_file" "/etc/gpumond-tls/ca.crt" -}}
{{- if ne $t.clientAuthType "NoClientCert" -}}
{{- $_ := set $tlsConfig "cert_file" "/etc/gpumond-tls/tls.crt" -}}
{{- $_ := set $tlsConfig "key_file" "/etc/gpumond-tls/tls.key" -}}
{{- end -}}
{{- $_ := set $relay "tls_config" $tlsConfig -}}
{{- end -}}
{{- end -}}
{{- if include "gpumond.relayNodeToken" $root -}}
{{- if or $relay.authorization $relay.basic_auth -}}
{{- fail "agent.config.relay: agent.relay.nodeToken gives the relay its authorization; remove authorization / basic_auth from agent.config.relay, or set agent.relay.nodeToken: false" -}}
{{- end -}}
{{- if not (or (include "gpumond.createSecret" $root) $root.Values.secret.existingSecret) -}}
{{- fail "agent.relay.nodeToken: no Secret holds a token for the relay (rules.enabled is false); give secret.rulesTokens or secret.existingSecret" -}}
{{- end -}}
{{- $_ := set $relay "authorization" (dict "credentials_file" "/etc/gpumond-relay/token") -}}
{{- end -}}
{{- /* 24 MiB unless set: the daemon's 64 MiB default does not fit agent.resources.limits.memory (128Mi) over the
       agent's own ~80 MiB, and a buffer filling in a long outage would get the agent killed, losing all it holds. */ -}}
{{- if not (hasKey $relay "buffer_max_bytes") -}}
{{- $_ := set $relay "buffer_max_bytes" 25165824 -}}
{{- end -}}
{{- $_ := set .cfg "relay" $relay -}}
{{- end -}}
{{- end -}}

{{/* Whether the relay pushes under a token of its own (agent.relay.nodeToken, with the agent and the relay on). */}}
{{- define "gpumond.relayNodeToken" -}}
{{- $r := .Values.agent.relay -}}
{{- if and .Values.agent.enabled $r.enabled $r.nodeToken -}}true{{- end -}}
{{- end -}}

{{/* The rules service's rules.yaml, likewise. */}}
{{- define "gpumond.rulesConfig" -}}
{{- $cfg := deepCopy (default dict .Values.rules.config) -}}
{{- range $key := list "listen" "state_dir" "shard" "tokens" "tokens_file" -}}
{{- if hasKey $cfg $key -}}
{{- fail (printf "rules.config.%s: set by the chart (rules.port, the state volume, rules.sharded, secret.rulesTokens); remove it from rules.config" $key) -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.rules.sharded) (gt (int .Values.rules.replicas) 1) -}}
{{- fail "rules.replicas: more than 1 needs rules.sharded: true (unsharded replicas would each get part of every job's pushes and page twice)" -}}
{{- end -}}
{{- include "gpumond.tlsOwnsWebConfig" (dict "cfg" $cfg "component" "rules" "root" .) -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.rules.port)) -}}
{{- $_ := set $cfg "state_dir" "/var/lib/gpumond-rules" -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "gpumond.checkMonitors" -}}
{{- if and .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled -}}
{{- fail "monitoring: enable serviceMonitor or podMonitor, not both (every target would be scraped twice)" -}}
{{- end -}}
{{- end -}}


{{/* ----- TLS (values: tls, monitoring.tlsConfig) ----------------------------------------------------------- */}}
{{/* With tls.enabled the chart owns web_config_file: the web.yml it writes next to the daemon's config. */}}
{{- define "gpumond.tlsOwnsWebConfig" -}}
{{- if .root.Values.tls.enabled -}}
{{- if hasKey .cfg "web_config_file" -}}
{{- fail (printf "%s.config.web_config_file: set by the chart when tls.enabled (it writes web.yml); remove it from %s.config" .component .component) -}}
{{- end -}}
{{- $_ := set .cfg "web_config_file" "/etc/gpumond/web.yml" -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding a component's serving certificate, checked to be named. */}}
{{- define "gpumond.tlsSecret" -}}
{{- $name := index .root.Values.tls (printf "%sSecret" .component) -}}
{{- if not $name -}}
{{- fail (printf "tls.%sSecret: name the Secret with the %s's certificate (tls.crt, tls.key, ca.crt, as cert-manager writes it), or set tls.enabled: false" .component .component) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* web.yml: the exporter-toolkit web config gpumond reads (docs/configuration.md#tls-and-authentication). */}}
{{- define "gpumond.webConfig" -}}
{{- $t := .Values.tls -}}
tls_server_config:
  cert_file: /etc/gpumond-tls/tls.crt
  key_file: /etc/gpumond-tls/tls.key
  client_auth_type: {{ $t.clientAuthType }}
  {{- if ne $t.clientAuthType "NoClientCert" }}
  client_ca_file: /etc/gpumond-tls/ca.crt
  {{- end }}
  min_version: {{ $t.minVersion }}
{{- end -}}

{{/* A probe: HTTPS with TLS (the kubelet does not verify the certificate); a TCP check when every client must
     present a certificate, which the kubelet cannot. */}}
{{- define "gpumond.probe" -}}
{{- $t := .root.Values.tls -}}
{{- if and $t.enabled (eq $t.clientAuthType "RequireAndVerifyClientCert") -}}
tcpSocket: {port: {{ .port }}}
{{- else -}}
httpGet: {path: {{ .path }}, port: {{ .port }}{{ if $t.enabled }}, scheme: HTTPS{{ end }}}
{{- end -}}
{{- end -}}

{{/* A monitor endpoint's scheme and tlsConfig: the component's CA and Service name, then monitoring.tlsConfig. */}}
{{- define "gpumond.monitorTls" -}}
{{- $root := .root -}}
{{- if $root.Values.tls.enabled -}}
{{- $given := default dict $root.Values.monitoring.tlsConfig -}}
{{- if and (eq $root.Values.tls.clientAuthType "RequireAndVerifyClientCert") (not (and $given.cert $given.keySecret)) -}}
{{- fail "monitoring.tlsConfig: tls.clientAuthType RequireAndVerifyClientCert refuses a Prometheus without a client certificate; give cert and keySecret (a Secret in this namespace)" -}}
{{- end -}}
{{- $default := dict "ca" (dict "secret" (dict "name" (include "gpumond.tlsSecret" (dict "root" $root "component" .component)) "key" "ca.crt")) "serverName" (include (printf "gpumond.%sName" .component) $root) -}}
scheme: https
tlsConfig:
  {{- toYaml (mergeOverwrite $default (deepCopy $given)) | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Fleet remediation through the Kubernetes API: rules.config.remediation.backend is kubernetes. */}}
{{- define "gpumond.remediatesNodes" -}}
{{- $rem := get (.Values.rules.config | default dict) "remediation" | default dict -}}
{{- if and .Values.rules.enabled (eq (get $rem "backend" | default "none") "kubernetes") (ne (get $rem "mode" | default "dry_run") "off") -}}
true
{{- end -}}
{{- end -}}
