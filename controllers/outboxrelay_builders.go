/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// The pure builders of the relay Deployments: names, labels, arguments, environment, and the
// Deployment of one shard (relayDeployment). Nothing here reads the cluster or the database.

package controllers

import (
	"cmp"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Labels and annotations on the relay Deployments and pods.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelComponent = "app.kubernetes.io/component"
	LabelShard     = "outbox.dev/shard"

	// AnnotationSecretHash on the pod template holds a hash of the referenced Secret values, so a
	// changed Secret rolls the relays.
	AnnotationSecretHash = "outbox.dev/secret-hash"

	relayAppName  = "outbox-relay"
	managedBy     = "outbox-operator"
	containerName = "relay"
	httpPortName  = "http"
	httpPort      = contract.RelayHTTPPort
	tlsVolumeName = "kafka-tls"
	tlsMountPath  = "/etc/outbox/kafka-tls"
	tmpVolumeName = "tmp"
	relayUID      = 65532
	// relayCommand is the relay binary in the image (the operator image carries /manager and /relay).
	relayCommand   = "/relay"
	fieldOwnerName = "outboxrelay-controller"
)

// Environment variables the operator sets. The CRD refuses them in spec.relay.env; the builder
// drops them from the user's list as well, so the operator's value always wins.
const (
	envDatabaseURL  = contract.EnvDatabaseURL
	envSASLUsername = contract.EnvSASLUsername
	envSASLPassword = contract.EnvSASLPassword
	envTLSInsecure  = contract.EnvTLSInsecureSkipVerify
)

// DeploymentName is the name of the relay Deployment of shard k.
func DeploymentName(relay string, shard int32) string {
	return fmt.Sprintf("%s-shard-%d", relay, shard)
}

// Selector returns the label selector of every relay pod of an OutboxRelay (status.selector).
func Selector(relay string) string {
	return LabelName + "=" + relayAppName + "," + LabelInstance + "=" + relay
}

// relayPodLabels select every relay pod of an OutboxRelay (Selector as a map): its Deployments'
// and its PodDisruptionBudget's.
func relayPodLabels(relay string) map[string]string {
	return map[string]string{LabelName: relayAppName, LabelInstance: relay}
}

// selectorLabels select the pods of one shard. They are immutable on a Deployment: never change them.
func selectorLabels(relay string, shard int32) map[string]string {
	sel := relayPodLabels(relay)
	sel[LabelShard] = strconv.Itoa(int(shard))
	return sel
}

// qualifiedTable returns schema.name for the spec's table ("outbox" -> "public.outbox").
func qualifiedTable(table string) string {
	if table == "" {
		table = v1alpha1.DefaultTable
	}
	if !strings.Contains(table, ".") {
		return "public." + table
	}
	return table
}

// topicMap renders spec.topics as aggregateType=topic,... sorted by aggregate type.
func topicMap(topics map[string]v1alpha1.TopicName) string {
	keys := make([]string, 0, len(topics))
	for k := range topics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + string(topics[k])
	}
	return strings.Join(parts, ",")
}

// tlsFile is one file of a TLS volume (Kafka's, the schema registry's), the Secret key it comes
// from and the relay setting that names it.
type tlsFile struct {
	ref     v1alpha1.SecretKeyRef
	path    string // file name under the volume's mount path
	setting contract.Setting
}

// tlsFiles lists the files of spec.kafka.tls with their default keys filled in.
func tlsFiles(tls *v1alpha1.KafkaTLS) []tlsFile {
	if tls == nil || !tls.Enabled {
		return nil
	}
	return secretTLSFiles(tls.CASecretRef, tls.CertSecretRef, tls.KeySecretRef,
		contract.FlagKafkaTLSCAFile, contract.FlagKafkaTLSCert, contract.FlagKafkaTLSKey)
}

// secretTLSFiles lists the CA bundle, client certificate and key of those refs that are set,
// their keys defaulted (ca.crt, tls.crt, tls.key), each with the setting that names it.
func secretTLSFiles(ca, cert, key *v1alpha1.SecretKeyRef, caSetting, certSetting, keySetting contract.Setting) []tlsFile {
	var out []tlsFile
	add := func(ref *v1alpha1.SecretKeyRef, defKey, path string, setting contract.Setting) {
		if ref == nil {
			return
		}
		r := *ref
		if r.Key == "" {
			r.Key = v1alpha1.SecretKey(defKey)
		}
		out = append(out, tlsFile{ref: r, path: path, setting: setting})
	}
	add(ca, v1alpha1.DefaultCAKey, "ca.crt", caSetting)
	add(cert, v1alpha1.DefaultCertKey, "tls.crt", certSetting)
	add(key, v1alpha1.DefaultKeyKey, "tls.key", keySetting)
	return out
}

// withTLSVolume mounts files, read-only, at mountPath in container, from one projected volume
// of pod named name (none when files is empty).
func withTLSVolume(pod *corev1ac.PodSpecApplyConfiguration, container *corev1ac.ContainerApplyConfiguration, name, mountPath string, files []tlsFile) {
	if len(files) == 0 {
		return
	}
	projected := corev1ac.ProjectedVolumeSource().WithDefaultMode(0o440)
	for _, f := range files {
		projected.WithSources(corev1ac.VolumeProjection().WithSecret(corev1ac.SecretProjection().
			WithName(string(f.ref.Name)).
			WithItems(corev1ac.KeyToPath().WithKey(string(f.ref.Key)).WithPath(f.path))))
	}
	pod.WithVolumes(corev1ac.Volume().WithName(name).WithProjected(projected))
	container.WithVolumeMounts(corev1ac.VolumeMount().WithName(name).WithMountPath(mountPath).WithReadOnly(true))
}

// relayArgs renders the relay command line of one shard (docs/architecture.md, "Relay command
// line"), with the flag names the relay defines (contract.RunSettings).
// Secrets are never arguments: they reach the relay only as environment variables from Secrets.
// The shard count is not an argument either: the relays follow the table's shard layout
// (--shard-count=0), so a change of shards restarts no pod.
// defaultOTLP is the operator's --relay-otlp-endpoint: the relays of an OutboxRelay without
// spec.publish.tracing export their spans there (empty: they do not).
func relayArgs(relay *v1alpha1.OutboxRelay, shard int32, defaultOTLP string) []string {
	spec := &relay.Spec
	args := []string{
		"run",
		contract.FlagTable.Arg(qualifiedTable(spec.Database.Table)),
		contract.FlagShardCount.Arg("0"),
		contract.FlagShardIndex.Arg(strconv.Itoa(int(shard))),
		contract.FlagBrokers.Arg(joinBrokers(spec.Kafka.Brokers)),
	}
	if len(spec.Topics) > 0 {
		args = append(args, contract.FlagTopicMap.Arg(topicMap(spec.Topics)))
	}
	if spec.DefaultTopic != "" {
		args = append(args, contract.FlagDefaultTopic.Arg(string(spec.DefaultTopic)))
	}
	if r := spec.Routing; r != nil {
		if r.TopicBy != "" {
			args = append(args, contract.FlagTopicBy.Arg(string(r.TopicBy.Mode())))
		}
		if r.TopicHeader != "" {
			args = append(args, contract.FlagTopicHeader.Arg(string(r.TopicHeader)))
		}
		if r.KeyHeader != "" {
			args = append(args, contract.FlagKeyHeader.Arg(string(r.KeyHeader)))
		}
	}
	p := spec.Publish
	if p.BatchSize > 0 {
		args = append(args, contract.FlagBatchSize.Arg(strconv.Itoa(int(p.BatchSize))))
	}
	// Always said: the mode is the operator's to decide (resolveTracking), not the relay's default.
	args = append(args, contract.FlagTracking.Arg(string(relay.ResolvedTracking().Mode())))
	if p.PollInterval != nil && p.PollInterval.Duration > 0 {
		args = append(args, contract.FlagPollInterval.Arg(p.PollInterval.Duration.String()))
	}
	if p.Notify != nil {
		args = append(args, contract.FlagNotify.Arg(strconv.FormatBool(*p.Notify)))
	}
	if p.MaxDelay != nil {
		args = append(args, contract.FlagMaxDelay.Arg(p.MaxDelay.Duration.String()))
	}
	if p.IdlePollInterval != nil {
		args = append(args, contract.FlagIdlePoll.Arg(p.IdlePollInterval.Duration.String()))
	}
	if p.RecordTimestamp != "" {
		args = append(args, contract.FlagRecordTimestamp.Arg(string(p.RecordTimestamp.Mode())))
	}
	if p.Compression != "" {
		args = append(args, contract.FlagCompression.Arg(string(p.Compression.Mode())))
	}
	if p.NullPayload != "" {
		args = append(args, contract.FlagNullPayload.Arg(string(p.NullPayload.Mode())))
	}
	if p.Delivery == v1alpha1.DeliveryExactlyOnce {
		args = append(args, contract.FlagDelivery.Arg(string(p.Delivery.Mode())), contract.FlagCursorTopic.Arg(string(p.CursorTopic)))
	}
	if tr := p.Tracing; tr != nil {
		args = append(args, contract.FlagOTLPEndpoint.Arg(tr.OTLPEndpoint))
		if tr.SamplePercent != nil {
			args = append(args, contract.FlagTraceSample.Arg(strconv.FormatFloat(float64(*tr.SamplePercent)/100, 'f', -1, 64)))
		}
	} else if defaultOTLP != "" {
		args = append(args, contract.FlagOTLPEndpoint.Arg(defaultOTLP))
	}
	if ce := p.CloudEvents; ce != nil {
		source := cmp.Or(ce.Source, "/outbox-operator/"+relay.Namespace+"/"+relay.Name)
		args = append(args, contract.FlagCloudEvents.Arg(string(ce.Mode.Mode())), contract.FlagCloudEventsSrc.Arg(source))
	}
	args = append(args, schemaRegistryArgs(p.SchemaRegistry)...)
	if p.WaitForStandbys != nil && *p.WaitForStandbys > 0 {
		args = append(args, contract.FlagWaitForStandbys.Arg(strconv.Itoa(int(*p.WaitForStandbys))))
	}
	if p.MaxAttempts > 0 {
		args = append(args, contract.FlagMaxAttempts.Arg(strconv.Itoa(int(p.MaxAttempts))))
	}
	if p.MaxPayloadBytes != nil {
		args = append(args, contract.FlagMaxPayloadBytes.Arg(strconv.Itoa(int(*p.MaxPayloadBytes))))
	}
	if spec.PoisonEvents.Policy == v1alpha1.PoisonDeadLetter {
		args = append(args, contract.FlagPoisonPolicy.Arg(string(contract.PoisonDeadLetter)),
			contract.FlagDeadLetterTopic.Arg(string(spec.PoisonEvents.DeadLetterTopic)))
	} else {
		args = append(args, contract.FlagPoisonPolicy.Arg(string(contract.PoisonBlock)))
	}
	args = append(args, contract.FlagHTTPAddr.Arg(contract.RelayHTTPAddr))
	if tls := spec.Kafka.TLS; tls != nil && tls.Enabled {
		args = append(args, contract.FlagKafkaTLS.Arg("true"))
		for _, f := range tlsFiles(tls) {
			args = append(args, f.setting.Arg(tlsMountPath+"/"+f.path))
		}
	}
	if sasl := spec.Kafka.SASL; sasl != nil {
		args = append(args, contract.FlagKafkaSASL.Arg(strings.ToLower(string(sasl.Mechanism))))
	}
	return args
}

func joinBrokers(bs []v1alpha1.Broker) string {
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = string(b)
	}
	return strings.Join(s, ",")
}

// relayEnv returns the container environment: the user's extra variables first, then the secrets,
// each only as a secretKeyRef.
func relayEnv(relay *v1alpha1.OutboxRelay) []*corev1ac.EnvVarApplyConfiguration {
	var env []*corev1ac.EnvVarApplyConfiguration
	for _, e := range relay.Spec.Relay.Env {
		if contract.IsManagedEnv(e.Name) {
			continue
		}
		env = append(env, convert[corev1ac.EnvVarApplyConfiguration](e))
	}
	// The relays' own URL (spec.relay.databaseSecretRef, a least-privilege role), else the operator's.
	ref := relayDatabaseRef(relay)
	env = append(env, secretEnv(envDatabaseURL, string(ref.Name), ref.URLKey()))
	if tls := relay.Spec.Kafka.TLS; tls != nil && tls.Enabled && tls.InsecureSkipVerify {
		// An environment variable, not a flag: a relay that does not know the setting ignores it
		// and keeps verifying certificates, the safe side.
		env = append(env, corev1ac.EnvVar().WithName(envTLSInsecure).WithValue("true"))
	}
	if sasl := relay.Spec.Kafka.SASL; sasl != nil {
		uk, pk := sasl.SecretRef.Keys()
		env = append(env,
			secretEnv(envSASLUsername, string(sasl.SecretRef.Name), uk),
			secretEnv(envSASLPassword, string(sasl.SecretRef.Name), pk))
	}
	return append(env, schemaRegistryEnv(relay.Spec.Publish.SchemaRegistry)...)
}

func secretEnv(name, secret, key string) *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
		WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(secret).WithKey(key)))
}

// convert turns a core/v1 value into its apply configuration; both share one JSON shape.
func convert[T any](v any) *T {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", v, err)) // core/v1 types always marshal
	}
	out := new(T)
	if err := json.Unmarshal(data, out); err != nil {
		panic(fmt.Sprintf("unmarshal %T into %T: %v", v, out, err))
	}
	return out
}

// defaultRelayResources are used when spec.relay.resources is empty.
var defaultRelayResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("64Mi"),
	},
	Limits: corev1.ResourceList{
		corev1.ResourceMemory: resource.MustParse("512Mi"),
	},
}

// ownerReference makes the OutboxRelay the controller of a child object.
func ownerReference(relay *v1alpha1.OutboxRelay) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(v1alpha1.GroupVersion.String()).
		WithKind("OutboxRelay").
		WithName(relay.Name).
		WithUID(relay.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// relayDeployment builds the relay Deployment of one shard. It is pure: everything it needs is in
// its arguments. It holds only the fields the operator has an opinion on (server-side apply).
// relayDefaults are the operator's settings of every relay that its OutboxRelay's spec does not
// override: the image (--relay-image) and the OTLP endpoint (--relay-otlp-endpoint).
type relayDefaults struct {
	image, otlpEndpoint string
}

func relayDeployment(relay *v1alpha1.OutboxRelay, shard int32, secretHash string, d relayDefaults) *appsv1ac.DeploymentApplyConfiguration {
	image := d.image
	spec := &relay.Spec
	sel := selectorLabels(relay.Name, shard)
	labels := map[string]string{LabelManagedBy: managedBy, LabelComponent: "relay"}
	for k, v := range sel {
		labels[k] = v
	}
	podLabels := map[string]string{}
	for k, v := range spec.Relay.PodLabels {
		podLabels[k] = v
	}
	for k, v := range labels { // ours win
		podLabels[k] = v
	}
	podAnnotations := map[string]string{}
	for k, v := range spec.Relay.PodAnnotations {
		podAnnotations[k] = v
	}
	podAnnotations[AnnotationSecretHash] = secretHash

	replicas := int32(1)
	if spec.Paused {
		replicas = 0
	}
	if spec.Relay.Image != "" {
		image = spec.Relay.Image
	}

	resources := spec.Relay.Resources
	if len(resources.Requests) == 0 && len(resources.Limits) == 0 && len(resources.Claims) == 0 {
		resources = defaultRelayResources
	}

	container := corev1ac.Container().
		WithName(containerName).
		WithImage(image).
		WithCommand(relayCommand).
		WithArgs(relayArgs(relay, shard, d.otlpEndpoint)...).
		WithEnv(relayEnv(relay)...).
		WithPorts(corev1ac.ContainerPort().WithName(httpPortName).WithContainerPort(httpPort).WithProtocol(corev1.ProtocolTCP)).
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath(contract.PathHealthz).WithPort(intstr.FromString(httpPortName))).
			WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(3)).
		WithReadinessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath(contract.PathReadyz).WithPort(intstr.FromString(httpPortName))).
			WithPeriodSeconds(5).WithTimeoutSeconds(3).WithFailureThreshold(3)).
		WithResources(convert[corev1ac.ResourceRequirementsApplyConfiguration](resources)).
		WithSecurityContext(corev1ac.SecurityContext().
			WithRunAsNonRoot(true).
			WithReadOnlyRootFilesystem(true).
			WithAllowPrivilegeEscalation(false).
			WithCapabilities(corev1ac.Capabilities().WithDrop(corev1.Capability("ALL"))).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
		WithVolumeMounts(corev1ac.VolumeMount().WithName(tmpVolumeName).WithMountPath("/tmp"))
	if spec.Relay.ImagePullPolicy != "" {
		container.WithImagePullPolicy(spec.Relay.ImagePullPolicy)
	}

	pod := corev1ac.PodSpec().
		// Long enough for the relay's own shutdown (the batch in flight, recording it, releasing
		// its locks): Kubernetes' default of 30 s is shorter.
		WithTerminationGracePeriodSeconds(int64(contract.RelayGracePeriod / time.Second)).
		WithAutomountServiceAccountToken(false).
		WithEnableServiceLinks(false).
		WithSecurityContext(corev1ac.PodSecurityContext().
			WithRunAsNonRoot(true).
			WithRunAsUser(relayUID).
			WithRunAsGroup(relayUID).
			WithFSGroup(relayUID).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
		WithVolumes(corev1ac.Volume().WithName(tmpVolumeName).
			WithEmptyDir(corev1ac.EmptyDirVolumeSource().WithSizeLimit(resource.MustParse("16Mi"))))

	withTLSVolume(pod, container, tlsVolumeName, tlsMountPath, tlsFiles(spec.Kafka.TLS))
	withSchemaRegistryVolumes(spec.Publish.SchemaRegistry, pod, container)
	pod.WithContainers(container)

	if spec.Relay.ServiceAccountName != "" {
		pod.WithServiceAccountName(spec.Relay.ServiceAccountName)
	}
	if len(spec.Relay.NodeSelector) > 0 {
		pod.WithNodeSelector(spec.Relay.NodeSelector)
	}
	for _, t := range spec.Relay.Tolerations {
		pod.WithTolerations(convert[corev1ac.TolerationApplyConfiguration](t))
	}
	if spec.Relay.Affinity != nil {
		pod.WithAffinity(convert[corev1ac.AffinityApplyConfiguration](spec.Relay.Affinity))
	}

	return appsv1ac.Deployment(DeploymentName(relay.Name, shard), relay.Namespace).
		WithLabels(labels).
		WithOwnerReferences(ownerReference(relay)).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(replicas).
			WithRevisionHistoryLimit(3).
			// Recreate: the old pod stops and releases its bucket locks before the new one starts.
			WithStrategy(appsv1ac.DeploymentStrategy().WithType(appsv1.RecreateDeploymentStrategyType)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(sel)).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(podLabels).
				WithAnnotations(podAnnotations).
				WithSpec(pod)))
}
