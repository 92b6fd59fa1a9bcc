package kube

import (
	"errors"
	"fmt"
	"io/fs"

	"k8s.io/client-go/tools/clientcmd"
)

// CheckKubeconfig loads the kubeconfig file and builds the client start-up builds (which reads
// the certificate files the kubeconfig names), without contacting the API server.
func CheckKubeconfig(path string) error {
	if path == "" {
		return nil
	}
	if _, err := clientcmd.LoadFromFile(path); err != nil {
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			return err // names the file already
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if _, err := newClientForConfig(cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
