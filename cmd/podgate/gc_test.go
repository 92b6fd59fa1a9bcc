package main

import "testing"

func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    int
		setByUs bool
	}{
		{name: "no GOGC: podgate's default", env: map[string]string{}, want: defaultGCPercent, setByUs: true},
		{name: "GOGC set: the runtime's", env: map[string]string{"GOGC": "100"}},
		{name: "GOGC=off: the runtime's", env: map[string]string{"GOGC": "off"}},
		{name: "GOGC empty: still set, the runtime's", env: map[string]string{"GOGC": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := gcPercent(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if ok != tc.setByUs || (ok && got != tc.want) {
				t.Errorf("gcPercent = %d, %v; want %d, %v", got, ok, tc.want, tc.setByUs)
			}
		})
	}
}
