package main

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// runH2spec runs h2spec against podgate's CRI socket and the grpc-go server's, each through a
// TCP→unix forwarder (h2spec speaks TCP), and prints every test's result side by side.
func runH2spec(ctx context.Context, r *rig, bin, path string) error {
	f, err := r.startFake()
	if err != nil {
		return err
	}
	defer f.stop()
	pg, err := r.startPodgate(ctx, f)
	if err != nil {
		return err
	}
	defer func() { _, _ = pg.Stop(30 * time.Second) }()
	results := map[string]map[string]string{} // server → test → result
	var podgateWhy map[string]string          // test → h2spec's failure text, podgate's
	for _, t := range []struct{ server, sock string }{{"podgate", pg.Socket}, {"grpc-go", f.sock}} {
		port, stop, err := forward(t.sock)
		if err != nil {
			return err
		}
		report := filepath.Join(r.dir, t.server+".xml")
		cmd := exec.CommandContext(ctx, bin, "-p", strconv.Itoa(port), "-P", path, "-o", "10", "-j", report)
		_ = cmd.Run() // h2spec exits non-zero when a test fails
		stop()
		var why map[string]string
		if results[t.server], why, err = readReport(report); err != nil {
			return fmt.Errorf("%s: %w", t.server, err)
		}
		if t.server == "podgate" {
			podgateWhy = why
		}
	}
	return printSideBySide(results["podgate"], results["grpc-go"], podgateWhy)
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
			Error   *struct{} `xml:"error"`
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
			if c.Failure != nil {
				// h2spec's expected and actual frames.
				why[c.Package+" "+c.ClassName] = strings.Join(strings.Fields(c.Failure.Text), " ")
			}
		}
	}
	return out, why, nil
}

func printSideBySide(pg, gg, pgWhy map[string]string) error {
	var names []string
	for n := range pg {
		names = append(names, n)
	}
	for n := range gg {
		if _, ok := pg[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	count := func(m map[string]string, res string) int {
		n := 0
		for _, r := range m {
			if r == res {
				n++
			}
		}
		return n
	}
	fmt.Printf("podgate: %d passed, %d failed, %d skipped; grpc-go: %d passed, %d failed, %d skipped\n\n",
		count(pg, "pass"), count(pg, "FAIL"), count(pg, "skip"), count(gg, "pass"), count(gg, "FAIL"), count(gg, "skip"))
	fmt.Println("| test | podgate | grpc-go |")
	fmt.Println("|---|---|---|")
	for _, n := range names {
		if pg[n] == "pass" && gg[n] == "pass" {
			continue
		}
		mark := ""
		if pg[n] == "FAIL" && gg[n] != "FAIL" {
			mark = " **podgate's alone**"
		}
		fmt.Printf("| %s | %s%s | %s |\n", n, pg[n], mark, gg[n])
	}
	fmt.Println("\n(tests both pass are left out)")
	for _, n := range names {
		if pg[n] == "FAIL" && gg[n] != "FAIL" {
			fmt.Printf("\npodgate's alone, %s: %s\n", n, pgWhy[n])
		}
	}
	return nil
}
