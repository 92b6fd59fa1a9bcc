package sysctl

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// maxValueLen bounds a sysctl value. The kernel reads at most a page per write; the longest
// values pods use (port lists for ip_local_reserved_ports) are far below that.
const maxValueLen = 4096

// format checks the value of one known sysctl.
type format func(v string) error

// formats holds the value formats of the sysctls podgate knows; others get the generic checks.
var formats = map[Name]format{
	"kernel.shm_rmid_forced":              intRange(0, 1),
	"net.ipv4.tcp_syncookies":             intRange(0, 2),
	"net.ipv4.tcp_slow_start_after_idle":  intRange(0, 1),
	"net.ipv4.ip_unprivileged_port_start": intRange(0, 65535),
	"net.ipv4.tcp_keepalive_time":         intRange(1, math.MaxInt32/1000), // seconds, kept in ms-safe range by the kernel
	"net.ipv4.tcp_keepalive_intvl":        intRange(1, math.MaxInt32/1000),
	"net.ipv4.tcp_keepalive_probes":       intRange(1, 127),
	"net.ipv4.tcp_fin_timeout":            intRange(1, math.MaxInt32/1000),
	"net.ipv4.tcp_notsent_lowat":          intRange(0, math.MaxUint32),
	"net.ipv4.ip_local_port_range":        orderedInts(2, 1, 65535),
	"net.ipv4.ping_group_range":           orderedInts(2, 0, math.MaxUint32-1),
	"net.ipv4.tcp_rmem":                   orderedInts(3, 1, math.MaxInt32),
	"net.ipv4.tcp_wmem":                   orderedInts(3, 1, math.MaxInt32),
	"net.ipv4.ip_local_reserved_ports":    portList,
}

// CheckValue validates a value for sysctl n: printable characters only (no newline, which would
// let one write carry a second value), a bounded length, and the sysctl's own format when known.
func CheckValue(n Name, v string) error {
	if v == "" {
		if n == reservedPorts { // empty: no reserved ports, the default
			return nil
		}
		return fmt.Errorf("empty value")
	}
	if len(v) > maxValueLen {
		return fmt.Errorf("value is %d bytes, at most %d", len(v), maxValueLen)
	}
	for _, r := range v {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || r > unicode.MaxASCII {
			return fmt.Errorf("value has %q: only printable ASCII (separate fields with spaces)", r)
		}
	}
	if f, ok := formats[n]; ok {
		return f(v)
	}
	return nil
}

func intRange(lo, hi int64) format {
	return func(v string) error {
		_, err := parseInt(v, lo, hi)
		return err
	}
}

// decimalRE is an integer as the kernel reads it unambiguously: no sign, no leading zero (the
// kernel reads "0600" as octal 384, and refuses "+5" and "09").
var decimalRE = regexp.MustCompile(`^(0|[1-9][0-9]{0,18})$`)

func parseInt(s string, lo, hi int64) (int64, error) {
	if !decimalRE.MatchString(s) {
		return 0, fmt.Errorf("%q is not a plain decimal integer (no sign, no leading zeros)", s)
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	if i < lo || i > hi {
		return 0, fmt.Errorf("%d out of range [%d, %d]", i, lo, hi)
	}
	return i, nil
}

// orderedInts is n integers in [lo, hi], each at least the one before ("min default max").
func orderedInts(n int, lo, hi int64) format {
	return func(v string) error {
		fields := strings.Fields(v)
		if len(fields) != n {
			return fmt.Errorf("want %d integers separated by spaces, got %d fields", n, len(fields))
		}
		prev := lo
		for _, f := range fields {
			i, err := parseInt(f, lo, hi)
			if err != nil {
				return err
			}
			if i < prev {
				return fmt.Errorf("%d is less than the value before it", i)
			}
			prev = i
		}
		return nil
	}
}

// portList is ip_local_reserved_ports: comma-separated ports and port ranges ("8080,9000-9100"),
// without spaces, which the kernel refuses.
func portList(v string) error {
	_, err := portSet(v)
	return err
}

// portSet parses a port list into the set of ports it names.
func portSet(v string) (*[65536]bool, error) {
	var set [65536]bool
	if v == "" {
		return &set, nil
	}
	for item := range strings.SplitSeq(v, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := parseInt(lo, 1, 65535)
		if err != nil {
			return nil, fmt.Errorf("port %w", err)
		}
		b := a
		if isRange {
			if b, err = parseInt(hi, 1, 65535); err != nil {
				return nil, fmt.Errorf("port %w", err)
			}
			if b < a {
				return nil, fmt.Errorf("port range %s is reversed", item)
			}
		}
		for p := a; p <= b; p++ {
			set[p] = true
		}
	}
	return &set, nil
}

// SameValue compares a value read from /proc/sys for n with the wanted one as the kernel keeps
// it: field by field (the kernel separates fields with tabs and ends with a newline), and for
// ip_local_reserved_ports as the set of ports (the kernel prints "9000-9100,8080" as
// "8080,9000-9100").
func SameValue(n Name, got, want string) bool {
	if n == reservedPorts {
		g, err1 := portSet(strings.TrimSpace(got))
		w, err2 := portSet(strings.TrimSpace(want))
		return err1 == nil && err2 == nil && *g == *w
	}
	return strings.Join(strings.Fields(got), " ") == strings.Join(strings.Fields(want), " ")
}

const reservedPorts Name = "net.ipv4.ip_local_reserved_ports"
