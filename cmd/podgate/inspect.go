package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/imagepull/progress"
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// The inspection commands (pods, pod, pulls) read a running podgate's PodResources extension,
// as crictl reads the CRI socket: a table by default, -o json or -o yaml for the messages the
// extension answers (the same as grpcurl shows). Exit status: 0, 1 when podgate cannot be
// asked or does not know the pod, 2 on a usage error.

// inspectOptions are the flags the inspection commands share.
type inspectOptions struct {
	socket  string
	output  string
	timeout time.Duration
}

func (o *inspectOptions) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.socket, "socket", config.DefaultPodResourcesSocket, "podgate's PodResources socket (podResources.socket)")
	fs.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for podgate's answer")
}

// check refuses a bad output format before podgate is asked.
func (o *inspectOptions) check() error {
	switch o.output {
	case "table", "json", "yaml":
		return nil
	}
	return fmt.Errorf("invalid output format %q: want table, json or yaml", o.output)
}

// call connects to the socket and runs fn with a client, within the timeout.
func (o *inspectOptions) call(ctx context.Context, fn func(context.Context, pb.PodResourcesClient) error) error {
	conn, err := grpc.NewClient("unix://"+o.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return &exitError{code: 1, err: fmt.Errorf("socket %s: %w", o.socket, err)}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := fn(ctx, pb.NewPodResourcesClient(conn)); err != nil {
		return &exitError{code: 1, err: o.explain(err)}
	}
	return nil
}

// explain says what a failed call means for the person who typed the command.
func (o *inspectOptions) explain(err error) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("cannot reach podgate at %s (is podgate running, and is this its podResources.socket? --socket): %s", o.socket, st.Message())
	case codes.NotFound, codes.InvalidArgument:
		return errors.New(st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("the podgate at %s is older than this command: %s", o.socket, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("podgate at %s did not answer within %s (--timeout)", o.socket, o.timeout)
	}
	return fmt.Errorf("podgate at %s: %s: %s", o.socket, st.Code(), st.Message())
}

// print writes m as JSON or YAML, or calls table.
func (o *inspectOptions) print(w io.Writer, m proto.Message, table func(*tabwriter.Writer)) error {
	switch o.output {
	case "json", "yaml":
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			return &exitError{code: 1, err: err}
		}
		if o.output == "yaml" {
			if b, err = yaml.JSONToYAML(b); err != nil {
				return &exitError{code: 1, err: err}
			}
		} else {
			// protojson varies its spacing on purpose; the output is indented afresh, so that
			// it is the same from one podgate build to the next, as kubectl's is.
			var out bytes.Buffer
			if err := json.Indent(&out, b, "", "  "); err != nil {
				return &exitError{code: 1, err: err}
			}
			b = append(out.Bytes(), '\n')
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	table(tw)
	return tw.Flush()
}

func newPodsCommand() *cobra.Command {
	var o inspectOptions
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pods podgate knows on this node",
		Long: `List the pods podgate knows on this node, from its PodResources socket: each pod's
sandbox, the verification of its sysctls, its DRA claims, containers and waiting image pulls.`,
		Example: "  podgate pods\n  podgate pods -o yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			var resp *pb.ListResponse
			if err := o.call(cmd.Context(), func(ctx context.Context, c pb.PodResourcesClient) (err error) {
				resp, err = c.List(ctx, &pb.ListRequest{})
				return err
			}); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w *tabwriter.Writer) { podsTable(w, resp.GetPods(), time.Now()) })
		},
	}
	o.addFlags(cmd)
	return cmd
}

func newPodCommand() *cobra.Command {
	var o inspectOptions
	cmd := &cobra.Command{
		Use:     "pod NAMESPACE/NAME",
		Short:   "Show what podgate knows of one pod",
		Example: "  podgate pod default/web\n  podgate pod kube-system/coredns-x -o json",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("want one NAMESPACE/NAME, got %d arguments\nusage: %s NAMESPACE/NAME", len(args), cmd.CommandPath())
			}
			if ns, name, ok := strings.Cut(args[0], "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return fmt.Errorf("%q: want NAMESPACE/NAME", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			ns, name, _ := strings.Cut(args[0], "/")
			var resp *pb.GetResponse
			if err := o.call(cmd.Context(), func(ctx context.Context, c pb.PodResourcesClient) (err error) {
				resp, err = c.Get(ctx, &pb.GetRequest{PodNamespace: ns, PodName: name})
				return err
			}); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp.GetPod(), func(w *tabwriter.Writer) { describePod(w, resp.GetPod(), time.Now()) })
		},
	}
	o.addFlags(cmd)
	return cmd
}

func newPullsCommand() *cobra.Command {
	var o inspectOptions
	cmd := &cobra.Command{
		Use:   "pulls [NAMESPACE/NAME]",
		Short: "Show the image pulls in podgate's queue, with their progress",
		Long: `Show the image pulls podgate's pull governor holds, queued and running, oldest first:
each pull's pod, image, place in the queue and the cap that holds it, its wait, the bytes the
runtime has fetched, and its kind (image, or security_profile: a seccomp profile Kubernetes
1.38 pulls with PullSecurityProfile). With NAMESPACE/NAME, that pod's pulls only.`,
		Example: "  podgate pulls\n  podgate pulls default/web -o json",
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) > 1:
				return fmt.Errorf("want at most one NAMESPACE/NAME, got %d arguments", len(args))
			case len(args) == 1:
				if ns, name, ok := strings.Cut(args[0], "/"); !ok || ns == "" || name == "" {
					return fmt.Errorf("%q: want NAMESPACE/NAME", args[0])
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			var req pb.PodPullsRequest
			if len(args) == 1 {
				req.PodNamespace, req.PodName, _ = strings.Cut(args[0], "/")
			}
			var resp *pb.PodPullsResponse
			if err := o.call(cmd.Context(), func(ctx context.Context, c pb.PodResourcesClient) (err error) {
				resp, err = c.PodPulls(ctx, &req)
				return err
			}); err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), resp, func(w *tabwriter.Writer) { pullsTable(w, resp.GetPulls(), time.Now()) })
		},
	}
	o.addFlags(cmd)
	return cmd
}

// podsTable is the pods in kubectl's style: upper-case headers, one line each.
func podsTable(w io.Writer, pods []*pb.Pod, now time.Time) {
	fmt.Fprintln(w, "NAMESPACE\tNAME\tSANDBOX\tSTATE\tSYSCTLS\tCLAIMS\tCONTAINERS\tPULLS\tAGE")
	for _, p := range pods {
		sb := p.GetSandbox()
		prepared := 0
		for _, c := range p.GetClaims() {
			if c.GetPrepared() {
				prepared++
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", p.GetNamespace(), p.GetName(), shortID(sb.GetId()), sandboxState(sb),
			orNone(sb.GetSysctls().GetVerification()), prepared, len(p.GetClaims()), len(p.GetContainers()), len(p.GetImagePulls()), age(sb.GetCreatedAt(), now))
	}
}

// pullsTable is the pulls, oldest first.
func pullsTable(w io.Writer, pulls []*pb.ImagePull, now time.Time) {
	fmt.Fprintln(w, "POD\tIMAGE\tSTATE\tPLACE\tWAITING FOR\tWAITED\tPROGRESS\tRATE\tSHARED WITH\tSTALL\tKIND")
	for _, p := range pulls {
		pod := "-"
		if p.GetPodName() != "" {
			pod = p.GetPodNamespace() + "/" + p.GetPodName()
		}
		place, waitingFor := "-", "-"
		if p.GetState() == pb.ImagePull_QUEUED {
			place = fmt.Sprintf("%d/%d", p.GetPosition(), p.GetQueued())
			waitingFor = capOf(p, now)
		}
		waited := now.Sub(p.GetSince().AsTime())
		if p.GetStarted() != nil {
			waited = p.GetStarted().AsTime().Sub(p.GetSince().AsTime())
		}
		fetched, rate := "-", "-"
		if p.GetBytesTotal() > 0 {
			fetched = progress.Bytes(p.GetBytesDone()).Short() + "/" + progress.Bytes(p.GetBytesTotal()).Short()
			rate = progress.Bytes(p.GetBytesPerSecond()).Short() + "/s"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", pod, p.GetImage(), pullState(p), place, waitingFor,
			max(0, waited).Round(time.Second), fetched, rate, orDash(p.GetSharedWith()), orDash(stalling(p)), pullKind(p))
	}
}

// describePod is one pod in kubectl describe's style.
func describePod(w io.Writer, p *pb.Pod, now time.Time) {
	sb := p.GetSandbox()
	fmt.Fprintf(w, "Name:\t%s\nNamespace:\t%s\nUID:\t%s\n", p.GetName(), p.GetNamespace(), p.GetUid())
	fmt.Fprintf(w, "Sandbox:\t%s\n", orNone(sb.GetId()))
	if sb != nil {
		fmt.Fprintf(w, "  State:\t%s\n  Runtime handler:\t%s\n  Adopted:\t%v\n  Network namespace:\t%s\n  IPs:\t%s\n  Age:\t%s\n",
			sandboxState(sb), orNone(sb.GetRuntimeHandler()), sb.GetAdopted(), orNone(sb.GetNetns()), orNone(strings.Join(sb.GetIps(), ", ")), age(sb.GetCreatedAt(), now))
		s := sb.GetSysctls()
		fmt.Fprintf(w, "Sysctls:\t%s\n", orNone(s.GetVerification()))
		for _, k := range sortedKeys(s.GetApplied()) {
			fmt.Fprintf(w, "  %s\t%s\n", k, s.GetApplied()[k])
		}
		for _, m := range s.GetMismatches() {
			fmt.Fprintf(w, "  mismatch:\t%s\n", m)
		}
		if s.GetError() != "" {
			fmt.Fprintf(w, "  error:\t%s\n", s.GetError())
		}
	}
	fmt.Fprintf(w, "Claims:\t%s\n", countOrNone(len(p.GetClaims())))
	for _, c := range p.GetClaims() {
		fmt.Fprintf(w, "  %s/%s\tprepared: %v\n", c.GetNamespace(), c.GetName(), c.GetPrepared())
		for _, d := range c.GetDevices() {
			fmt.Fprintf(w, "    %s/%s/%s\t%s\n", d.GetDriver(), d.GetPool(), d.GetDevice(), d.GetNetwork().GetInterfaceName())
		}
	}
	fmt.Fprintf(w, "Containers:\t%s\n", countOrNone(len(p.GetContainers())))
	for _, c := range p.GetContainers() {
		fmt.Fprintf(w, "  %s\t%s\tcgroup: %s\n", c.GetName(), shortID(c.GetId()), orNone(c.GetVerification()))
	}
	fmt.Fprintf(w, "Image pulls:\t%s\n", countOrNone(len(p.GetImagePulls())))
	for _, ip := range p.GetImagePulls() {
		line := pullState(ip)
		if k := pullKind(ip); k != "image" {
			line = k + ", " + line
		}
		if ip.GetState() == pb.ImagePull_QUEUED {
			line += fmt.Sprintf(", place %d of %d, waiting for %s", ip.GetPosition(), ip.GetQueued(), waitingFor(ip, now))
		}
		if ip.GetBytesTotal() > 0 {
			line += fmt.Sprintf(", %s of %s", progress.Bytes(ip.GetBytesDone()).Short(), progress.Bytes(ip.GetBytesTotal()).Short())
		}
		if st := stalling(ip); st != "" {
			line += ", " + st
		}
		fmt.Fprintf(w, "  %s\t%s\n", ip.GetImage(), line)
	}
}

// stalling says how long a running pull has been below the stall rule's rate, of the window
// after which podgate cancels it: "stalling: 210B/s < 1.0KiB/s for 40s of 5m"; "" when it is
// not (or podgate finds no stalls).
func stalling(p *pb.ImagePull) string {
	if p.GetStallingFor() == nil || p.GetStallMinBytesPerSecond() == 0 {
		return ""
	}
	return fmt.Sprintf("stalling: %s/s < %s/s for %s of %s", progress.Bytes(p.GetStallBytesPerSecond()).Short(),
		progress.Bytes(p.GetStallMinBytesPerSecond()).Short(), p.GetStallingFor().AsDuration().Round(time.Second), progress.ShortDuration(p.GetStallWindow().AsDuration()))
}

func sandboxState(sb *pb.Sandbox) string {
	switch {
	case sb == nil:
		return "Pending"
	case sb.GetState() == pb.Sandbox_READY:
		return "Ready"
	case sb.GetState() == pb.Sandbox_NOT_READY:
		return "NotReady"
	}
	return "Unknown"
}

// pullKind is what the pull fetches: "image" or "security_profile" (Kubernetes 1.38's
// PullSecurityProfile); an older podgate says nothing, and pulls only images.
func pullKind(p *pb.ImagePull) string {
	if p.GetKind() == "" {
		return "image"
	}
	return p.GetKind()
}

func pullState(p *pb.ImagePull) string {
	if p.GetState() == pb.ImagePull_PULLING {
		return "Pulling"
	}
	return "Queued"
}

// capOf names the cap that holds a queued pull: "node (3)", "quay.io (2)", "docker.io
// cool-down (429, next try in 8s)", "docker.io rate (next in 2m0s)".
func capOf(p *pb.ImagePull, now time.Time) string {
	switch p.GetWaitingFor() {
	case "node":
		return fmt.Sprintf("node (%d)", p.GetMaxParallel())
	case "registry":
		return fmt.Sprintf("%s (%d)", p.GetRegistry(), p.GetRegistryCap())
	case "cool-down":
		return fmt.Sprintf("%s cool-down (%d, %s)", p.GetRegistry(), p.GetPushBackCode(), nextTry(p, now))
	case "rate":
		return fmt.Sprintf("%s rate (%s)", p.GetRegistry(), nextTry(p, now))
	}
	return orDash(p.GetWaitingFor())
}

// waitingFor says what holds a queued pull, for podgate pod: "the node (3) cap", "docker.io's
// cool-down since 10:00:00Z (429, next try in 8s, refused 2 times; held until 10:05:00Z)".
func waitingFor(p *pb.ImagePull, now time.Time) string {
	switch p.GetWaitingFor() {
	case "cool-down":
		return fmt.Sprintf("%s's cool-down since %s (%d, %s, refused %d times; held until %s)", p.GetRegistry(),
			clock(p.GetCoolingSince()), p.GetPushBackCode(), nextTry(p, now), p.GetPushBacks(), clock(p.GetHeldUntil()))
	case "rate":
		return fmt.Sprintf("%s's request budget (%s)", p.GetRegistry(), nextTry(p, now))
	}
	return "the " + capOf(p, now) + " cap"
}

// nextTry is when a pull held by its registry is tried next: "next try in 8s", "probing" while
// another pull tries the registry.
func nextTry(p *pb.ImagePull, now time.Time) string {
	if p.GetProbing() {
		return "probing"
	}
	if p.GetNextTry() == nil {
		return "next try now"
	}
	return "next try in " + max(0, p.GetNextTry().AsTime().Sub(now)).Round(time.Second).String()
}

// clock is a moment of podgate's answer, in UTC to the second; "-" when unset.
func clock(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.TimeOnly) + "Z"
}

func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return orNone(id)
}

func age(ts *timestamppb.Timestamp, now time.Time) string {
	if ts == nil {
		return "-"
	}
	d := now.Sub(ts.AsTime())
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func countOrNone(n int) string {
	if n == 0 {
		return "<none>"
	}
	return fmt.Sprint(n)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
