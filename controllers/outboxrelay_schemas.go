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
// variables from the Secret, the CA bundle and the schemas' ConfigMap as read-only volumes.

package controllers

import (
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

const (
	registryCAVolumeName = "schema-registry-ca"
	registryCAMountPath  = "/etc/outbox/schema-registry-ca"
	schemasVolumeName    = "schemas"
	schemasMountPath     = "/etc/outbox/schemas"
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
	if sr.CASecretRef != nil {
		args = append(args, contract.FlagSchemaCAFile.Arg(registryCAMountPath+"/ca.crt"))
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

// registryCARef is the Secret key of the registry's CA bundle (nil: none), its key defaulted.
func registryCARef(sr *v1alpha1.SchemaRegistrySpec) *v1alpha1.SecretKeyRef {
	if sr == nil || sr.CASecretRef == nil {
		return nil
	}
	ref := *sr.CASecretRef
	if ref.Key == "" {
		ref.Key = v1alpha1.DefaultCAKey
	}
	return &ref
}

// withSchemaRegistryVolumes mounts sr's CA bundle and schemas, read-only, into the relay's pod.
func withSchemaRegistryVolumes(sr *v1alpha1.SchemaRegistrySpec, pod *corev1ac.PodSpecApplyConfiguration, container *corev1ac.ContainerApplyConfiguration) {
	if ref := registryCARef(sr); ref != nil {
		pod.WithVolumes(corev1ac.Volume().WithName(registryCAVolumeName).WithProjected(
			corev1ac.ProjectedVolumeSource().WithDefaultMode(0o440).WithSources(corev1ac.VolumeProjection().
				WithSecret(corev1ac.SecretProjection().WithName(string(ref.Name)).
					WithItems(corev1ac.KeyToPath().WithKey(string(ref.Key)).WithPath("ca.crt"))))))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName(registryCAVolumeName).WithMountPath(registryCAMountPath).WithReadOnly(true))
	}
	if sr != nil && sr.SchemasConfigMapRef != nil {
		pod.WithVolumes(corev1ac.Volume().WithName(schemasVolumeName).WithConfigMap(
			corev1ac.ConfigMapVolumeSource().WithName(string(sr.SchemasConfigMapRef.Name)).WithDefaultMode(0o444)))
		container.WithVolumeMounts(corev1ac.VolumeMount().WithName(schemasVolumeName).WithMountPath(schemasMountPath).WithReadOnly(true))
	}
}
