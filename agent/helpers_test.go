package agent

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/state"
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/kubefake"
)

// sameJSON reports whether a and b encode to the same JSON: what the checkpoint would hold.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// agentProxies holds, for each agent newAgent made, what its Run built once it serves.
var agentProxies sync.Map // *Agent → func() *proxy

// newAgent is New with a hook that keeps what Run builds, for the test to look into (proxyOf).
func newAgent(t testing.TB, cfg *config.Configuration, opts ...Option) *Agent {
	t.Helper()
	served := make(chan *proxy, 1)
	keep := func(a *Agent) { a.serving = func(p *proxy) { served <- p } }
	a := New(cfg, "test", append(opts, keep)...)
	agentProxies.Store(a, sync.OnceValue(func() *proxy {
		select {
		case p := <-served:
			return p
		case <-time.After(30 * time.Second):
			return nil
		}
	}))
	return a
}

// proxyOf returns what the Run of a, made by newAgent, built; it waits until a serves.
func proxyOf(t testing.TB, a *Agent) *proxy {
	t.Helper()
	get, ok := agentProxies.Load(a)
	if !ok {
		t.Fatal("proxyOf: the agent was not made by newAgent")
	}
	p := get.(func() *proxy)()
	if p == nil {
		t.Fatal("the agent did not serve within 30s")
	}
	return p
}

// runAgentWithAPI runs an agent of cfg on the fake API server client until the test ends, and
// waits for its pod informer's sync.
func runAgentWithAPI(t *testing.T, cfg *config.Configuration, client *fake.Clientset) *Agent {
	t.Helper()
	a := newAgent(t, cfg, WithKubernetesAPI(kubefake.Wrap(client)))
	stop := runAgentOf(t, a)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitGauge(t, a, "podgate_kube_pod_informer_synced", 1)
	return a
}

// openTestState is podgate's state read from the checkpoint in stateDir, as start-up reads it.
func openTestState(t testing.TB, stateDir string) *state.State {
	t.Helper()
	st, err := state.Read(registry.NewCheckpoint(stateDir))
	if err != nil {
		t.Fatal(err)
	}
	return st
}
