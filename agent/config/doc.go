// Package config is podgate's configuration file (apiVersion podgate.dev/v1alpha1, kind
// AgentConfiguration): its types, strict decoding with line numbers in errors, defaults,
// validation, and the deeper checks of `podgate check-config` (Check). It owns no running
// state; the agent reads a validated Configuration and builds from it.
package config
