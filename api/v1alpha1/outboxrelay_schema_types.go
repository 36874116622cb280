package v1alpha1

import "github.com/outbox-operator/outbox-operator/internal/contract"

// SchemaRegistrySpec frames each payload in the Schema Registry wire format (a zero magic byte,
// the schema's id in four bytes, and for Protobuf the message indexes), the schema looked up in
// a Confluent-compatible registry (Confluent Schema Registry, Apicurio's ccompat API, Karapace,
// Redpanda), so that consumers with a registry-aware deserializer read the events.
// +kubebuilder:validation:XValidation:rule="!(has(self.caSecretRef) || has(self.certSecretRef)) || self.url.startsWith('https://')",message="schemaRegistry.caSecretRef and certSecretRef need an https:// url"
// +kubebuilder:validation:XValidation:rule="has(self.certSecretRef) == has(self.keySecretRef)",message="schemaRegistry.certSecretRef and keySecretRef go together"
type SchemaRegistrySpec struct {
	// url is the base of the registry's Confluent-compatible API, such as
	// http://schema-registry:8081 or https://registry.example/apis/ccompat/v7. Credentials do
	// not belong in it (credentialsSecretRef).
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s@/]+(/[^\s@]*)?$`
	URL string `json:"url"`

	// format is the payloads' schema type: JSON (the event's jsonb payload, framed as it is),
	// Avro or Protobuf (the event's payload_bytes, encoded by the application). An event without
	// the payload its format frames is poison (spec.poisonEvents).
	// +required
	Format SchemaFormat `json:"format"`

	// subjectStrategy names the subject of an event's schema, as Confluent's serializers do,
	// with the event type as the record name: TopicName (unset: <topic>-value), RecordName
	// (<event type>) or TopicRecordName (<topic>-<event type>).
	// +optional
	SubjectStrategy SubjectStrategy `json:"subjectStrategy,omitempty"`

	// validation is None (unset: payloads are framed as they are) or Enforce: each payload is
	// checked against its schema before it is published (JSON Schema validation, Avro and
	// Protobuf decoding), and one that does not fit is poison, with the schema's complaint as
	// its error.
	// +optional
	Validation SchemaValidation `json:"validation,omitempty"`

	// schemasConfigMapRef names a ConfigMap of schemas, one key per event type:
	// <event type>.json, .avsc or .proto (the format's). The relays register an event type's
	// schema under its subject (the registry keeps one version per distinct schema: registering
	// again returns the same id) and use the id it answers; event types without a key use the
	// latest version of their subject. The relays read it when they start; a change rolls them.
	// Unset: every subject's latest version, registered by someone else. Apicurio guesses a JSON Schema's type from its text: give such schemas a
	// "$schema".
	// +optional
	SchemasConfigMapRef *ConfigMapRef `json:"schemasConfigMapRef,omitempty"`

	// credentialsSecretRef selects the registry's basic-auth username and password. They reach
	// the relay only as environment variables from the Secret.
	// +optional
	CredentialsSecretRef *SASLSecretRef `json:"credentialsSecretRef,omitempty"`

	// caSecretRef selects the CA bundle that signs the registry's certificate (default key
	// ca.crt); an https:// url only. Without it the system roots are used.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`

	// certSecretRef selects the relays' client certificate for mutual TLS (default key
	// tls.crt); an https:// url only, with keySecretRef.
	// +optional
	CertSecretRef *SecretKeyRef `json:"certSecretRef,omitempty"`

	// keySecretRef selects the client certificate's private key (default key tls.key).
	// +optional
	KeySecretRef *SecretKeyRef `json:"keySecretRef,omitempty"`
}

// SchemaValidation says whether payloads are checked against their schemas.
// +kubebuilder:validation:Enum=None;Enforce
type SchemaValidation string

// Schema validations.
const (
	SchemaValidationNone    SchemaValidation = "None"
	SchemaValidationEnforce SchemaValidation = "Enforce"
)

// ConfigMapRef names a ConfigMap in the OutboxRelay's namespace.
type ConfigMapRef struct {
	// name of the ConfigMap.
	// +required
	Name SecretName `json:"name"`
}

// SchemaFormat is the schema type of the payloads framed for a schema registry.
// +kubebuilder:validation:Enum=JSON;Avro;Protobuf
type SchemaFormat string

// Schema formats.
const (
	SchemaJSON     SchemaFormat = "JSON"
	SchemaAvro     SchemaFormat = "Avro"
	SchemaProtobuf SchemaFormat = "Protobuf"
)

// Mode returns the format in the contract's spelling.
func (f SchemaFormat) Mode() contract.SchemaFormat {
	switch f {
	case SchemaJSON:
		return contract.SchemaJSON
	case SchemaAvro:
		return contract.SchemaAvro
	case SchemaProtobuf:
		return contract.SchemaProtobuf
	}
	return contract.SchemaNone
}

// SubjectStrategy is how a schema registry subject is named.
// +kubebuilder:validation:Enum=TopicName;RecordName;TopicRecordName
type SubjectStrategy string

// Subject strategies.
const (
	SubjectTopicName       SubjectStrategy = "TopicName"
	SubjectRecordName      SubjectStrategy = "RecordName"
	SubjectTopicRecordName SubjectStrategy = "TopicRecordName"
)

// Mode returns the strategy in the contract's spelling.
func (s SubjectStrategy) Mode() contract.SubjectStrategy {
	switch s {
	case SubjectRecordName:
		return contract.SubjectRecord
	case SubjectTopicRecordName:
		return contract.SubjectTopicRecord
	}
	return contract.SubjectTopic
}
