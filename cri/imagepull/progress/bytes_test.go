package progress

import "testing"

// TestBytes: binary units, with a space as kubectl writes them and without as crictl's
// columns do.
func TestBytes(t *testing.T) {
	tests := []struct {
		n           Bytes
		long, short string
	}{
		{0, "0 B", "0B"},
		{1023, "1023 B", "1023B"},
		{1024, "1.0 KiB", "1.0KiB"},
		{1 << 20, "1.0 MiB", "1.0MiB"},
		{3 << 19, "1.5 MiB", "1.5MiB"},
		{12 << 20, "12.0 MiB", "12.0MiB"},
		{5 << 30, "5.0 GiB", "5.0GiB"},
	}
	for _, tt := range tests {
		if got := tt.n.String(); got != tt.long {
			t.Errorf("Bytes(%d).String() = %q, want %q", int64(tt.n), got, tt.long)
		}
		if got := tt.n.Short(); got != tt.short {
			t.Errorf("Bytes(%d).Short() = %q, want %q", int64(tt.n), got, tt.short)
		}
	}
}
