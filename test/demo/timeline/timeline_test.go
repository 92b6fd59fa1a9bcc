package timeline

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// sampleStages are the pipeline stages of samplePod.
var sampleStages = []string{"sysctl-check", "dra-prepare", "forward", "sysctl-verify", "dra-attach"}

// samplePod is a pod start as the demo records one: the RunPodSandbox call with podgate's
// stages inside it, the pull with its wait, and the CNI ADD inside the forward stage.
func samplePod(t0 time.Time) Pod {
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	return Pod{
		Name: "demo/web",
		Spans: []Span{
			{Lane: Kubelet, Name: "RunPodSandbox", Start: at(0), End: at(200)},
			{Lane: Podgate, Name: "sysctl-check", Start: at(1), End: at(1.02)},
			{Lane: Podgate, Name: "dra-prepare", Start: at(1.02), End: at(12)},
			{Lane: Podgate, Name: "forward", Start: at(12), End: at(170), Detail: "containerd <creates> & runs CNI"},
			{Lane: Podgate, Name: "sysctl-verify", Start: at(170), End: at(173)},
			{Lane: Podgate, Name: "dra-attach", Start: at(173), End: at(199)},
			{Lane: Kubelet, Name: "PullImage", Start: at(210), End: at(2300)},
			{Lane: Podgate, Name: "pull-wait", Start: at(211), End: at(1200)},
			{Lane: Podgate, Name: "pull", Start: at(1200), End: at(2299)},
		},
		Marks: []Mark{
			{Name: "driver prepared", At: at(11), Detail: "created pgnic0"},
			{Name: "CNI ADD", At: at(90), Detail: "pgnic0 on the host"},
		},
	}
}

// TestWriteRead draws pods and reads the picture back with encoding/xml: every stage is there,
// in the order and at the times drawn, the marks too, and text that needs escaping survives.
func TestWriteRead(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	pods := []Pod{samplePod(t0), {Name: "demo/hello", Spans: []Span{{Lane: Kubelet, Name: "RunPodSandbox", Start: t0, End: t0.Add(time.Second)}}}}
	var buf bytes.Buffer
	if err := Write(&buf, `pod starts "& more"`, pods); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatalf("Read: %v\n%s", err, buf.String())
	}
	if len(got) != 2 || got[0].Name != "demo/web" || got[1].Name != "demo/hello" {
		t.Fatalf("pods %+v, want demo/web and demo/hello", got)
	}
	web := got[0]
	var names []string
	for _, s := range web.Spans {
		names = append(names, s.Lane+":"+s.Name)
	}
	want := "kubelet:RunPodSandbox podgate:sysctl-check podgate:dra-prepare podgate:forward podgate:sysctl-verify podgate:dra-attach kubelet:PullImage podgate:pull-wait podgate:pull"
	if strings.Join(names, " ") != want {
		t.Errorf("spans drawn %v, want %s", names, want)
	}
	forward, _ := web.Span(Podgate, "forward")
	if forward.StartMS != 12 || forward.EndMS != 170 {
		t.Errorf("forward drawn at %v..%v ms, want 12..170", forward.StartMS, forward.EndMS)
	}
	if cni, ok := web.Mark("CNI ADD"); !ok || cni.AtMS != 90 {
		t.Errorf("CNI ADD mark %+v (found %v), want at 90 ms", cni, ok)
	}
	if err := CheckPodStart(web, sampleStages); err != nil {
		t.Errorf("CheckPodStart of a well-formed start: %v", err)
	}
}

// TestCheckPodStart: a picture whose stages are out of order, overlap, leave the call they
// belong to, or whose CNI ADD is outside forward, is refused with the reason.
func TestCheckPodStart(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 2, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		edit func(p *Pod)
		want string
	}{
		{"swapped stages", func(p *Pod) { p.Spans[2], p.Spans[3] = p.Spans[3], p.Spans[2] }, "dra-prepare"},
		{"stage missing", func(p *Pod) { p.Spans = append(p.Spans[:4], p.Spans[5:]...) }, "sysctl-verify"},
		{"stage outside its call", func(p *Pod) { p.Spans[5].End = p.Spans[0].End.Add(time.Millisecond) }, "outside RunPodSandbox"},
		{"CNI ADD outside forward", func(p *Pod) { p.Marks[1].At = p.Spans[0].Start.Add(180 * time.Millisecond) }, "CNI ADD"},
		{"pull before its wait", func(p *Pod) { p.Spans[7], p.Spans[8] = p.Spans[8], p.Spans[7] }, "pull"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := samplePod(t0)
			tc.edit(&p)
			var buf bytes.Buffer
			if err := Write(&buf, "x", []Pod{p}); err != nil {
				t.Fatal(err)
			}
			got, err := Read(&buf)
			if err != nil {
				t.Fatal(err)
			}
			err = CheckPodStart(got[0], sampleStages)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckPodStart: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestTickStep(t *testing.T) {
	for _, tc := range []struct {
		total, want time.Duration
	}{
		{3 * time.Second, 500 * time.Millisecond},
		{200 * time.Millisecond, 20 * time.Millisecond},
		{7 * time.Millisecond, time.Millisecond},
		{90 * time.Microsecond, 10 * time.Microsecond},
	} {
		if got := tickStep(tc.total); got != tc.want {
			t.Errorf("tickStep(%s) = %s, want %s", tc.total, got, tc.want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		48 * time.Microsecond:   "48µs",
		1250 * time.Microsecond: "1.25ms",
		312 * time.Millisecond:  "312ms",
		2310 * time.Millisecond: "2.31s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%s) = %q, want %q", d, got, want)
		}
	}
}
