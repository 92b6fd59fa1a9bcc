package dra

import (
	"fmt"
	"strings"
)

// Error is a DRA driver's failure to do what a pod needs: the driver is not registered, cannot
// be reached, does not answer in time, fails a call, or fails one claim. Its class, for
// errors.Is and errdefs.Resolve, is errdefs.ErrUnavailable (the node cannot serve the pod's
// claims now, the kubelet will retry), or the caller's context error when the caller gave up
// first. It never carries a gRPC status: the driver's status is flattened into the message, so
// that the CRI boundary maps podgate's class and not the driver's code.
type Error struct {
	// Driver is the driver's name.
	Driver string
	// Operation is "prepare" or "unprepare"; empty when the driver was not found.
	Operation string
	// Claim is the claim the driver failed when it failed one claim of a call that answered;
	// nil when the call itself failed.
	Claim *Claim

	msg   string
	class error
}

// Error returns the message: the operation and claims, the driver, what went wrong.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the class: errdefs.ErrUnavailable, context.Canceled or
// context.DeadlineExceeded.
func (e *Error) Unwrap() error { return e.class }

// callError is the failure of a whole call of op for claims, e.g. "prepare claims ns/a, ns/b:
// DRA driver d: no answer within 45s".
func callError(class error, driver, op string, claims []Claim, format string, args ...any) *Error {
	return &Error{
		Driver:    driver,
		Operation: op,
		msg:       fmt.Sprintf("%s %s: DRA driver %s: ", op, claimList(claims), driver) + fmt.Sprintf(format, args...),
		class:     class,
	}
}

// claimError is the failure of one claim in a call that answered, e.g. "prepare claim ns/a
// (uid u): DRA driver d: <the driver's message>".
func claimError(class error, driver, op string, c Claim, format string, args ...any) *Error {
	return &Error{
		Driver:    driver,
		Operation: op,
		Claim:     &c,
		msg:       fmt.Sprintf("%s claim %s (uid %s): DRA driver %s: ", op, c, c.UID, driver) + fmt.Sprintf(format, args...),
		class:     class,
	}
}

// claimList names claims for a message: "claim ns/a", "claims ns/a, ns/b", at most a few.
func claimList(claims []Claim) string {
	const most = 4
	if len(claims) == 1 {
		return "claim " + claims[0].String()
	}
	names := make([]string, 0, most+1)
	for i, c := range claims {
		if i == most {
			names = append(names, fmt.Sprintf("and %d more", len(claims)-most))
			break
		}
		names = append(names, c.String())
	}
	return "claims " + strings.Join(names, ", ")
}

// claimErrors are the failures of several claims in one call: a message per claim, joined by
// "; " to stay on one line for the kubelet's events; errdefs.Resolve finds the first's class.
type claimErrors []error

func (e claimErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap returns the claims' errors, for errors.Is, errors.As and errdefs.Resolve.
func (e claimErrors) Unwrap() []error { return e }

// joinClaimErrors returns nil for no errors, the error itself for one, else claimErrors.
func joinClaimErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return claimErrors(errs)
}
