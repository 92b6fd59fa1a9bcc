package main

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podgate/podgate/cri/relay"
)

// runH2spec runs h2spec against podgate's CRI socket and two grpc-go servers, each through a
// TCP→unix forwarder (h2spec speaks TCP), and prints every test's result side by side. The
// second grpc-go server advertises podgate's own stream limit (relay.MaxStreams), so that the
// tests of a limit (h2spec skips them where none is advertised) are compared like for like.
func runH2spec(ctx context.Context, r *rig, bin, path string, tests []string) error {
	f, err := r.startFake()
	if err != nil {
		return err
	}
	defer f.stop()
	limited, err := r.startFake("-max-streams", strconv.Itoa(relay.MaxStreams))
	if err != nil {
		return err
	}
	defer limited.stop()
	pg, err := r.startPodgate(ctx, f, "")
	if err != nil {
		return err
	}
	defer func() { _, _ = pg.Stop(30 * time.Second) }()
	runs := []h2specRun{{server: "podgate", sock: pg.Socket}, {server: "grpc-go", sock: f.sock}, {server: grpcGoLimited, sock: limited.sock}}
	for i := range runs {
		t := &runs[i]
		port, stop, err := forward(t.sock)
		if err != nil {
			return err
		}
		report := filepath.Join(r.dir, strconv.Itoa(i)+".xml")
		args := append([]string{"-p", strconv.Itoa(port), "-P", path, "-o", "10", "-j", report}, tests...)
		_ = exec.CommandContext(ctx, bin, args...).Run() // h2spec exits non-zero when a test fails
		stop()
		if t.results, t.why, err = readReport(report); err != nil {
			return fmt.Errorf("%s: %w", t.server, err)
		}
	}
	printSideBySide(runs)
	return nil
}

// grpcGoLimited names the grpc-go server run with podgate's stream limit.
var grpcGoLimited = fmt.Sprintf("grpc-go, %d streams", relay.MaxStreams)

// h2specRun is one server's h2spec results: each test's result and, for a failure, h2spec's
// expected and actual frames.
type h2specRun struct {
	server, sock string
	results, why map[string]string
}

// forward listens on a free TCP port of loopback and passes each connection to sock.
func forward(sock string) (int, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", sock)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); _ = u.(*net.UnixConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, func() { _ = l.Close() }, nil
}

type junitSuites struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Package   string `xml:"package,attr"`
			ClassName string `xml:"classname,attr"`
			Failure   *struct {
				Text string `xml:",chardata"`
			} `xml:"failure"`
			Skipped *struct{} `xml:"skipped"`
			Error   *struct {
				Text string `xml:",chardata"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// readReport reads h2spec's JUnit report: each test's result by its id and title.
func readReport(file string) (map[string]string, map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, nil, err
	}
	out, why := map[string]string{}, map[string]string{}
	for _, suite := range s.Suites {
		for _, c := range suite.Cases {
			res := "pass"
			switch {
			case c.Failure != nil || c.Error != nil:
				res = "FAIL"
			case c.Skipped != nil:
				res = "skip"
			}
			out[c.Package+" "+c.ClassName] = res
			switch {
			case c.Failure != nil: // h2spec's expected and actual frames
				why[c.Package+" "+c.ClassName] = strings.Join(strings.Fields(c.Failure.Text), " ")
			case c.Error != nil: // the same, when the connection ended a test
				why[c.Package+" "+c.ClassName] = strings.Join(strings.Fields(c.Error.Text), " ")
			}
		}
	}
	return out, why, nil
}

// printSideBySide prints each server's totals and a table of the tests not every server
// passed; a failure is podgate's alone when no grpc-go server has it too.
func printSideBySide(runs []h2specRun) {
	names := map[string]bool{}
	for _, r := range runs {
		for n := range r.results {
			names[n] = true
		}
	}
	sorted := slices.Sorted(maps.Keys(names))
	var totals, header, rule []string
	for _, r := range runs {
		count := map[string]int{}
		for _, res := range r.results {
			count[res]++
		}
		totals = append(totals, fmt.Sprintf("%s: %d passed, %d failed, %d skipped", r.server, count["pass"], count["FAIL"], count["skip"]))
		header, rule = append(header, r.server), append(rule, "---")
	}
	fmt.Printf("%s\n\n| test | %s |\n|---|%s|\n", strings.Join(totals, "; "), strings.Join(header, " | "), strings.Join(rule, "|"))
	podgate, others := runs[0], runs[1:]
	alone := func(n string) bool {
		return podgate.results[n] == "FAIL" && !slices.ContainsFunc(others, func(o h2specRun) bool { return o.results[n] == "FAIL" })
	}
	for _, n := range sorted {
		if !slices.ContainsFunc(runs, func(r h2specRun) bool { return r.results[n] != "pass" }) {
			continue
		}
		cells := []string{n}
		for i, r := range runs {
			cell := r.results[n]
			if i == 0 && alone(n) {
				cell += " **podgate's alone**"
			}
			cells = append(cells, cell)
		}
		fmt.Printf("| %s |\n", strings.Join(cells, " | "))
	}
	fmt.Println("\n(tests every server passes are left out)")
	for _, n := range sorted {
		if podgate.results[n] == "FAIL" {
			fmt.Printf("\npodgate, %s: %s\n", n, podgate.why[n])
		}
	}
}
