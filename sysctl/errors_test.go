package sysctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassOr(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "containerd is restarting")
	tests := []struct {
		name  string
		err   error
		class error
	}{
		{"a runtime status keeps its code", fmt.Errorf("verify sysctls of sandbox x: %w", unavailable), errdefs.ErrUnavailable},
		{"a deadline stays a deadline", fmt.Errorf("verify sysctls of sandbox x: %w", context.DeadlineExceeded), context.DeadlineExceeded},
		{"an errdefs class stays", fmt.Errorf("x: %w", errdefs.ErrNotFound), errdefs.ErrNotFound},
		{"no class: the default", fmt.Errorf("read sysctl: %w", fs.ErrNotExist), errdefs.ErrFailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classOr(errdefs.ErrFailedPrecondition, tt.err)
			if got.Error() != tt.err.Error() {
				t.Errorf("message %q, want %q", got, tt.err)
			}
			if st, ok := status.FromError(got); ok {
				if want := codes.Unavailable; errors.Is(tt.class, errdefs.ErrUnavailable) && st.Code() != want {
					t.Errorf("code %s, want %s", st.Code(), want)
				}
				return
			}
			if c := errdefs.Resolve(got); !errors.Is(c, tt.class) {
				t.Errorf("class %v, want %v", c, tt.class)
			}
			if !errors.Is(got, tt.err) {
				t.Error("the cause is no longer in the chain")
			}
		})
	}
}
