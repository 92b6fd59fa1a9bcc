package sysctl

import (
	"errors"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/status"
)

// classOr returns err as it is when it already has a class — a gRPC status from the runtime or
// a driver, an errdefs class, a context error — so that the CRI boundary maps it to that code;
// otherwise err with class def (an errdefs class). The message is err's either way, and err's
// chain stays reachable with errors.Is and errors.As.
func classOr(def, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if !errors.Is(errdefs.Resolve(err), errdefs.ErrUnknown) {
		return err
	}
	return classedError{err: err, class: def}
}

// classedError is err with a class added: err first, so that what err wraps is found before
// the class.
type classedError struct{ err, class error }

func (e classedError) Error() string   { return e.err.Error() }
func (e classedError) Unwrap() []error { return []error{e.err, e.class} }
