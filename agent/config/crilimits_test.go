package config

import (
	"strings"
	"testing"
	"time"
)

// TestCRISocketLimits: unset limits take their defaults, set ones are kept, and a limit that
// would refuse a kubelet's own calls is an error naming the key and why.
func TestCRISocketLimits(t *testing.T) {
	c, err := Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	want := CRISocketLimits{
		ConnectionBytes: 64 << 20, TotalBytes: 256 << 20, MaxConnections: 4096, MaxHeaderListBytes: 64 << 10,
		IdleTimeout: Duration{5 * time.Minute}, KeepaliveTime: Duration{2 * time.Minute},
		KeepaliveTimeout: Duration{20 * time.Second}, RequestTimeout: Duration{2 * time.Minute},
		WriteTimeout: Duration{20 * time.Second}, WindowTimeout: Duration{time.Minute},
	}
	if c.CRISocketLimits != (CRISocketLimits{}) {
		t.Errorf("unset limits were filled in the file's configuration: %+v", c.CRISocketLimits)
	}
	if got := c.CRISocketLimits.effective(); got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	c, err = Parse([]byte(header + "criSocketLimits:\n  connectionBytes: 2097152\n  totalBytes: 4194304\n  maxConnections: 10\n  idleTimeout: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.CRISocketLimits.effective(); l.ConnectionBytes != 2<<20 || l.TotalBytes != 4<<20 || l.MaxConnections != 10 || l.IdleTimeout.Duration != time.Minute || l.RequestTimeout.Duration != 2*time.Minute {
		t.Errorf("set: %+v", l)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("set: %v", err)
	}
	for _, tc := range []struct{ doc, want string }{
		{"connectionBytes: 1000", "criSocketLimits.connectionBytes: 1000: must be at least 1048576 (1 MiB)"},
		{"connectionBytes: -1", "criSocketLimits.connectionBytes: -1: must be at least"},
		{"connectionBytes: 536870912", "criSocketLimits.totalBytes: 268435456: must be at least connectionBytes (536870912)"},
		{"maxConnections: -5", "criSocketLimits.maxConnections: -5: must be at least 1"},
		{"maxHeaderListBytes: 100", "criSocketLimits.maxHeaderListBytes: 100: must be from 4096 (4 KiB) to 16777216 (16 MiB)"},
		{"maxHeaderListBytes: 2097152\n  connectionBytes: 1048576\n  totalBytes: 1048576", "criSocketLimits.maxHeaderListBytes: 2097152: must not be above connectionBytes (1048576)"},
		{"idleTimeout: 10ms", "criSocketLimits.idleTimeout: 10ms: must be at least 1s"},
		{"keepaliveTimeout: -1s", "criSocketLimits.keepaliveTimeout: -1s: must be at least 1s"},
		{"requestTimeout: 500ms", "criSocketLimits.requestTimeout: 500ms: must be at least 1s"},
		{"writeTimeout: 100ms", "criSocketLimits.writeTimeout: 100ms: must be at least 1s"},
		{"windowTimeout: -1m", "criSocketLimits.windowTimeout: -1m0s: must be at least 1s"},
	} {
		c, err := Parse([]byte(header + "criSocketLimits:\n  " + tc.doc + "\n"))
		if err != nil {
			t.Errorf("%q: parse: %v", tc.doc, err)
			continue
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}
