package config

import (
	"strings"
	"testing"
)

func TestSandboxHookDrivers(t *testing.T) {
	for _, tc := range []struct {
		name, dra string
		want      string // in the error; empty: valid
	}{
		{name: "one driver", dra: "  sandboxHookDrivers: [dra.net]\n"},
		{name: "beside attach of another", dra: "  attach: [net.example.com]\n  sandboxHookDrivers: [dra.net]\n"},
		{name: "in dra.drivers", dra: "  drivers: [dra.net]\n  sandboxHookDrivers: [dra.net]\n"},
		{name: "also in attach", dra: "  attach: [dra.net]\n  sandboxHookDrivers: [dra.net]\n",
			want: `dra.sandboxHookDrivers[0]: "dra.net" is in dra.attach too`},
		{name: "not in dra.drivers", dra: "  drivers: [net.example.com]\n  sandboxHookDrivers: [dra.net]\n",
			want: `dra.sandboxHookDrivers[0]: "dra.net" is not in dra.drivers`},
		{name: "twice", dra: "  sandboxHookDrivers: [dra.net, dra.net]\n", want: `dra.sandboxHookDrivers[1]: "dra.net" listed twice`},
		{name: "empty name", dra: "  sandboxHookDrivers: [\"\"]\n", want: "dra.sandboxHookDrivers[0]: empty driver name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(header + "dra:\n" + tc.dra))
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}
