package podresources

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
)

// validPodRef checks a request's pod name and namespace as the API server would: the
// namespace a DNS-1123 label, the name a DNS-1123 subdomain. The error is InvalidArgument,
// naming the field.
func validPodRef(nameField, name, namespaceField, namespace string) error {
	if err := validField(namespaceField, namespace, validation.IsDNS1123Label); err != nil {
		return err
	}
	return validField(nameField, name, validation.IsDNS1123Subdomain)
}

func validField(field, value string, check func(string) []string) error {
	if value == "" {
		return status.Errorf(codes.InvalidArgument, "%s: must not be empty", field)
	}
	if errs := check(value); len(errs) > 0 {
		return status.Errorf(codes.InvalidArgument, "%s: %s: %s", field, quoteShort(value), strings.Join(errs, "; "))
	}
	return nil
}

// quoteShort quotes a client's value for an error message, cut so that a hostile one does not
// fill logs and answers.
func quoteShort(s string) string {
	const keep = 64
	if len(s) <= keep {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:keep], len(s))
}
