package imagepull

import "fmt"

// classError is a pull's failure as the caller sees it: a message of its own and a class, an
// errdefs error (errdefs.ErrAborted, errdefs.ErrInvalidArgument) or a context error, which the
// CRI boundary maps to the gRPC code the kubelet gets.
type classError struct {
	class error
	msg   string
}

func errorf(class error, format string, args ...any) error {
	return &classError{class: class, msg: fmt.Sprintf(format, args...)}
}

func (e *classError) Error() string { return e.msg }

// Unwrap returns the class, for errors.Is and errdefs.Resolve.
func (e *classError) Unwrap() error { return e.class }
