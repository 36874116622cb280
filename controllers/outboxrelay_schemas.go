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

// spec.publish.schemaRegistry in the relays' Deployments: their flags, the credentials as
// variables from the Secret, the TLS files and the schemas' ConfigMap as read-only volumes.

package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

const (
	registryTLSVolumeName = "schema-registry-tls"
	registryTLSMountPath  = "/etc/outbox/schema-registry-tls"
	schemasVolumeName     = "schemas"
	schemasMountPath      = "/etc/outbox/schemas"
)

// schemaRegistryArgs are the relay's --schema-* flags for sr (none when nil).
func schemaRegistryArgs(sr *v1alpha1.SchemaRegistrySpec) []string {
	if sr == nil {
		return nil
	}
	args := []string{
		contract.FlagSchemaRegistry.Arg(sr.URL),
		contract.FlagSchemaFormat.Arg(string(sr.Format.Mode())),
		contract.FlagSchemaSubject.Arg(string(sr.SubjectStrategy.Mode())),
	}
	if sr.Validation == v1alpha1.SchemaValidationEnforce {
		args = append(args, contract.FlagSchemaValidate.Arg("true"))
	}
	if sr.SchemasConfigMapRef != nil {
		args = append(args, contract.FlagSchemaDir.Arg(schemasMountPath))
	}
	for _, f := range registryTLSFiles(sr) {
		args = append(args, f.setting.Arg(registryTLSMountPath+"/"+f.path))
	}
	return args
}

// schemaRegistryEnv is the registry's credentials, as variables from their Secret.
func schemaRegistryEnv(sr *v1alpha1.SchemaRegistrySpec) []*corev1ac.EnvVarApplyConfiguration {
	if sr == nil || sr.CredentialsSecretRef == nil {
		return nil
	}
	uk, pk := sr.CredentialsSecretRef.Keys()
	name := string(sr.CredentialsSecretRef.Name)
	return []*corev1ac.EnvVarApplyConfiguration{
		secretEnv(contract.EnvRegistryUsername, name, uk),
		secretEnv(contract.EnvRegistryPassword, name, pk),
	}
}

// registryTLSFiles lists the registry's TLS files sr names (CA bundle, client certificate, key).
func registryTLSFiles(sr *v1alpha1.SchemaRegistrySpec) []tlsFile {
	if sr == nil {
		return nil
	}
	return secretTLSFiles(sr.CASecretRef, sr.CertSecretRef, sr.KeySecretRef,
		contract.FlagSchemaCAFile, contract.FlagSchemaCertFile, contract.FlagSchemaKeyFile)
}

// withSchemaRegistryVolumes mounts sr's CA bundle and schemas, read-only, into the relay's pod.
func withSchemaRegistryVolumes(sr *v1alpha1.SchemaRegistrySpec, pod *corev1ac.PodSpecApplyConfiguration, container *corev1ac.ContainerApplyConfiguration) {
	withTLSVolume(pod, container, registryTLSVolumeName, registryTLSMountPath, registryTLSFiles(sr))
	if sr != nil && sr.SchemasConfigMapRef != nil {
		pod.WithVolumes(corev1ac.Volume().WithName(schemasVolumeName).WithConfigMap(
			corev1ac.ConfigMapVolumeSource().WithName(string(sr.SchemasConfigMapRef.Name)).WithDefaultMode(0o444)))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName(schemasVolumeName).WithMountPath(schemasMountPath).WithReadOnly(true))
	}
}

// schemaRegistryEntries reads what the relays take from spec.publish.schemaRegistry's Secrets
// (credentials, CA bundle) and its schemas' ConfigMap, for the hash that rolls the relays when
// one changes (the relays read the schemas when they start). The ConfigMap is read uncached,
// as Secrets are, once per pass.
func (r *OutboxRelayReconciler) schemaRegistryEntries(ctx context.Context, s *scope) (map[string][]byte, error) {
	sr := s.relay.Spec.Publish.SchemaRegistry
	if sr == nil {
		return nil, nil
	}
	out, err := r.credentialEntries(ctx, s, registryTLSFiles(sr), sr.CredentialsSecretRef)
	if err != nil {
		return nil, err
	}
	if ref := sr.SchemasConfigMapRef; ref != nil {
		var cm corev1.ConfigMap
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.relay.Namespace, Name: string(ref.Name)}, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &errSecret{v1alpha1.ReasonConfigMapNotFound, fmt.Sprintf("ConfigMap %q not found", ref.Name)}
			}
			return nil, fmt.Errorf("while reading ConfigMap %q: %w", ref.Name, err)
		}
		for k, v := range cm.Data {
			out["configmap:"+cm.Name+"/"+k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			out["configmap:"+cm.Name+"/"+k] = v
		}
	}
	return out, nil
}
