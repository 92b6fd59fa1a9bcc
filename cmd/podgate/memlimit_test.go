package main

import (
	"testing"

	"github.com/podgate/podgate/agent/config"
)

func TestMemoryLimit(t *testing.T) {
	socket, none := "/run/podgate/pr.sock", ""
	for _, tc := range []struct {
		name    string
		cfg     config.Configuration
		env     map[string]string
		want    int64
		setByUs bool
	}{
		{name: "defaults: 256 MiB + 64 connections × 256 KiB + 64 MiB", cfg: config.Configuration{PodResources: config.PodResources{Socket: &socket}},
			want: 256<<20 + 64*256<<10 + 64<<20, setByUs: true},
		{name: "totalBytes and maxConnections set", cfg: config.Configuration{
			CRISocketLimits: config.CRISocketLimits{TotalBytes: 1 << 30},
			PodResources:    config.PodResources{Socket: &socket, MaxConnections: 8},
		}, want: 1<<30 + 8*256<<10 + 64<<20, setByUs: true},
		{name: "PodResources off", cfg: config.Configuration{PodResources: config.PodResources{Socket: &none}},
			want: 256<<20 + 64<<20, setByUs: true},
		{name: "GOMEMLIMIT set: the operator's", env: map[string]string{"GOMEMLIMIT": "1GiB"}},
		{name: "GOMEMLIMIT=off: the operator's", env: map[string]string{"GOMEMLIMIT": "off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := memoryLimit(&tc.cfg, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if ok != tc.setByUs || got != tc.want {
				t.Errorf("memoryLimit = %d, %v; want %d, %v", got, ok, tc.want, tc.setByUs)
			}
		})
	}
}
