package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--node-name", "n1", "--devices", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.DriverName != "net.podgate.test" || o.NodeName != "n1" || o.Devices != 2 ||
		o.RegistryDir != "/var/lib/kubelet/plugins_registry" ||
		o.PluginDir != "/var/lib/kubelet/plugins/net.podgate.test" ||
		o.InterfacePrefix != "pgnic" || o.CDIDir != "/var/run/cdi" || o.NetNSPath != "" {
		t.Errorf("defaults: %+v", o)
	}
	o, err = parseFlags([]string{"--node-name", "n1", "--driver-name", "x.example.com"}, io.Discard)
	if err != nil || o.PluginDir != "/var/lib/kubelet/plugins/x.example.com" {
		t.Errorf("plugin dir follows the driver name: %+v, %v", o, err)
	}
	for _, args := range [][]string{
		{},                           // no node name
		{"--node-name", "n1", "arg"}, // stray argument
		{"--bogus"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded", strings.Join(args, " "))
		}
	}
}
