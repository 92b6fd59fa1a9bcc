//go:build linux

package cluster

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

const (
	// serviceCIDR is the Service ClusterIP range. Only allocated from, never routed: there is
	// no kube-proxy, and nothing in the tests sends traffic to a Service.
	serviceCIDR = "10.96.0.0/16"
	// checkTimeout bounds each readiness probe.
	checkTimeout = 5 * time.Second
	// pollInterval is how often a readiness condition is checked.
	pollInterval = 100 * time.Millisecond
)

// draResources are the resource.k8s.io/v1 resources the DRA tests use: Up fails when the API
// server does not serve them.
var draResources = []string{"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"}

// errPortTaken means a daemon exited because a port picked free was taken before it bound it.
var errPortTaken = errors.New("port taken")

// startEtcd starts a single-member etcd on two loopback ports and waits until it is healthy.
func (c *Cluster) startEtcd(ctx context.Context) error {
	dataDir := filepath.Join(c.dir, "etcd")
	p, ports, err := c.startDaemon(ctx, "etcd", etcdTimeout, 2, func(ports []int) []string {
		// A failed attempt may have initialised a member with other peer URLs.
		_ = os.RemoveAll(dataDir)
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		return []string{
			"--name=podgate",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=podgate=" + peer,
			// The data dies with the test: durability only costs time on a busy disk.
			"--unsafe-no-fsync",
		}
	}, func(ctx context.Context, ports []int) error {
		return etcdHealthy(ctx, fmt.Sprintf("http://127.0.0.1:%d", ports[0]))
	})
	if err != nil {
		return err
	}
	c.etcd, c.etcdURL = p, fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	return nil
}

// etcdHealthy asks etcd's /health endpoint, which is true once the member has a leader.
func etcdHealthy(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd /health: %s: %s", resp.Status, body)
	}
	return nil
}

// startAPIServer starts kube-apiserver on a loopback port and waits until /readyz is ok and
// resource.k8s.io/v1 is served.
//
// Authentication is a static token file holding one admin token in system:masters; authorization
// is Node,RBAC as on a real cluster (system:masters passes both), so that tests may add
// identities with narrower rights. The endpoint reconciler is off: it would publish the
// advertise address as the kubernetes Service's endpoint, which no one here uses.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	certDir := filepath.Join(c.dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	if c.opts.AuditLog {
		if err := c.writeAuditPolicy(); err != nil {
			return fmt.Errorf("start kube-apiserver: %w", err)
		}
	}
	p, ports, err := c.startDaemon(ctx, "kube-apiserver", apiServerTimeout, 1, func(ports []int) []string {
		args := []string{
			"--etcd-servers=" + c.etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", ports[0]),
			"--cert-dir=" + certDir,
			"--tls-cert-file=" + filepath.Join(c.dir, "apiserver.crt"),
			"--tls-private-key-file=" + filepath.Join(c.dir, "apiserver.key"),
			"--token-auth-file=" + filepath.Join(c.dir, "tokens.csv"),
			"--authorization-mode=Node,RBAC",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + filepath.Join(c.dir, "sa.pub"),
			"--service-account-signing-key-file=" + filepath.Join(c.dir, "sa.key"),
			"--service-cluster-ip-range=" + serviceCIDR,
			"--endpoint-reconciler-type=none",
			// Test pods may need privileged containers (sysctl, network devices).
			"--allow-privileged=true",
			// One client, no overload to protect against: APF's queues only add start-up work.
			"--enable-priority-and-fairness=false",
			"--profiling=false",
			"--v=1",
		}
		if fg := featureGateFlag(c.opts.FeatureGates); fg != "" {
			args = append(args, "--feature-gates="+fg)
		}
		if c.opts.AuditLog {
			args = append(args, c.auditArgs()...)
		}
		return append(args, c.opts.APIServerArgs...)
	}, func(ctx context.Context, ports []int) error {
		if err := c.setClient(ports[0]); err != nil {
			return err
		}
		return c.apiServerReady(ctx)
	})
	if err != nil {
		return err
	}
	c.apiServer = p
	if err := c.checkDRAServed(); err != nil {
		return err
	}
	return c.writeKubeconfig(ports[0])
}

// setClient makes the admin client for the API server on port.
func (c *Cluster) setClient(port int) error {
	cfg := &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		BearerToken:     c.pki.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.servingCert},
		// client-go's default 5 QPS would make tests that poll or create many objects wait on
		// their own client rather than on the system under test.
		QPS:       100,
		Burst:     200,
		UserAgent: "podgate-test-cluster",
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	c.restConfig, c.client = cfg, client
	return nil
}

// apiServerReady is true when /readyz says ok: etcd reachable, every post-start hook done
// (bootstrap RBAC roles, priority classes, system namespaces).
func (c *Cluster) apiServerReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("/readyz: %w: %s", err, body)
	}
	if string(body) != "ok" {
		return fmt.Errorf("/readyz: %s", body)
	}
	return nil
}

// checkDRAServed fails unless resource.k8s.io/v1 serves the DRA resources. DRA is GA since 1.34:
// kube-apiserver 1.36 serves resource.k8s.io/v1 by default, without --runtime-config.
func (c *Cluster) checkDRAServed() error {
	list, err := c.client.Discovery().ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		return fmt.Errorf("kube-apiserver does not serve resource.k8s.io/v1: %w", err)
	}
	var have []string
	for _, r := range list.APIResources {
		have = append(have, r.Name)
	}
	for _, want := range draResources {
		if !slices.Contains(have, want) {
			return fmt.Errorf("kube-apiserver serves resource.k8s.io/v1 without %s (has %v)", want, have)
		}
	}
	return nil
}

// writeKubeconfig writes a kubeconfig with the admin token for the API server on port.
func (c *Cluster) writeKubeconfig(port int) error {
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: podgate
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: podgate
  context:
    cluster: podgate
    user: %s
current-context: podgate
`, port, base64.StdEncoding.EncodeToString(c.pki.servingCert), adminUser, c.pki.token, adminUser)
	if err := os.WriteFile(c.kubeconfig, []byte(content), 0o600); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return nil
}

// bootstrap does for the default namespace what the controller-manager would: see
// CreateNamespace. The API server creates the namespace itself shortly after it is ready.
func (c *Cluster) bootstrap(ctx context.Context) error {
	var last error
	err := poll(ctx, apiServerTimeout, func(ctx context.Context) (bool, error) {
		last = c.namespaceDefaults(ctx, metav1.NamespaceDefault)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("bootstrap namespace default: %w (%w)", err, last)
	}
	return nil
}

// CreateNamespace creates a namespace with what the controller-manager (which this cluster does
// not run) would add to it: the ServiceAccount "default", without which the ServiceAccount
// admission plugin refuses every pod, and the ConfigMap kube-root-ca.crt, which the projected
// service-account token volume reads. The namespace "default" has both from the start.
func (c *Cluster) CreateNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	if err := c.namespaceDefaults(ctx, name); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	return ns, nil
}

func (c *Cluster) namespaceDefaults(ctx context.Context, ns string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data:       map[string]string{"ca.crt": string(c.pki.servingCert)},
	}
	if _, err := c.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("config map kube-root-ca.crt: %w", err)
	}
	return nil
}

// startDaemon starts the daemon name on nports ports picked free and waits until ready says so.
// When the daemon exits because one of its ports was taken meanwhile, it tries again with new
// ports. args and ready get the ports.
func (c *Cluster) startDaemon(ctx context.Context, name string, timeout time.Duration, nports int,
	args func(ports []int) []string, ready func(ctx context.Context, ports []int) error) (*process, []int, error) {
	logger := klog.FromContext(ctx)
	logPath := filepath.Join(c.dir, name+".log")
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(nports)
		if err != nil {
			return nil, nil, fmt.Errorf("start %s: %w", name, err)
		}
		start := time.Now()
		p, err := startProcess(name, logPath, binPath(name), args(ports)...)
		if err != nil {
			return nil, nil, err
		}
		err = waitReady(ctx, p, timeout, func(ctx context.Context) error { return ready(ctx, ports) })
		if err == nil {
			logger.V(1).Info("Started", "daemon", name, "pid", p.cmd.Process.Pid, "ports", ports, "duration", time.Since(start).Round(time.Millisecond))
			return p, ports, nil
		}
		if serr := p.stop(stopGrace); serr != nil {
			err = errors.Join(err, serr)
		}
		if errors.Is(err, errPortTaken) && attempt < portAttempts {
			logger.Info("Port taken before the daemon bound it; trying other ports", "daemon", name, "ports", ports)
			continue
		}
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
}

// waitReady polls check every pollInterval until it succeeds, the process exits, timeout passes
// or ctx ends.
func waitReady(ctx context.Context, p *process, timeout time.Duration, check func(context.Context) error) error {
	var last, exited error
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		if done, err := p.exited(); done {
			if strings.Contains(logSinceStart(p.logPath), "address already in use") {
				err = errors.Join(errPortTaken, err)
			}
			exited = p.exitError(err)
			return false, exited
		}
		last = check(ctx)
		return last == nil, nil
	})
	switch {
	case err == nil || exited != nil:
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%s not ready: %w (last check: %w)", p.name, context.Cause(ctx), last)
	default:
		return fmt.Errorf("%s not ready after %s: %w\nlast lines of %s:\n%s", p.name, timeout, last, p.logPath, logTail(p.logPath, 30))
	}
}

// logSinceStart returns a log file from the marker startProcess wrote for the last run on.
func logSinceStart(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndex(s, "\n==== "); i >= 0 {
		return s[i:]
	}
	return s
}

// poll calls cond every pollInterval until it returns true or an error, or until timeout passes
// or ctx ends; then it returns the context's cause (the caller's, if it gave one).
func poll(ctx context.Context, timeout time.Duration, cond wait.ConditionWithContextFunc) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var condErr error
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		done, err := cond(ctx)
		condErr = err
		return done, err
	})
	if err != nil && condErr == nil {
		return context.Cause(ctx)
	}
	return err
}

// freePorts returns n loopback TCP ports that were free a moment ago. All n listeners are open at
// once, so the ports differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// featureGateFlag formats gates as --feature-gates wants them, sorted.
func featureGateFlag(gates map[string]bool) string {
	var kv []string
	for k, v := range gates {
		kv = append(kv, fmt.Sprintf("%s=%t", k, v))
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// FreezeAPIServer stops kube-apiserver (SIGSTOP to its process group) until the returned thaw
// lets it go on (SIGCONT): meanwhile it accepts connections but answers nothing, as an API
// server cut off by the network, and afterwards it goes on with its state and its port, so
// the cluster's clients and its Down work as before. The cluster's Down thaws it too.
func (c *Cluster) FreezeAPIServer() (thaw func() error, err error) {
	if c.apiServer == nil {
		return nil, errors.New("freeze kube-apiserver: not started")
	}
	pgid := c.apiServer.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("freeze kube-apiserver: %w", err)
	}
	var once sync.Once
	thaw = func() error {
		var err error
		once.Do(func() {
			if e := syscall.Kill(-pgid, syscall.SIGCONT); e != nil && !errors.Is(e, syscall.ESRCH) {
				err = fmt.Errorf("thaw kube-apiserver: %w", e)
			}
		})
		return err
	}
	c.thaw = thaw
	return thaw, nil
}
