package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseStartupPages gives back the pages of podgate's own binary that only start-up needed.
// Package initialisation, flag and configuration parsing and the registry's rebuild touch
// ≈ 17 MiB of the binary's code and read-only data that podgate never runs again, and those
// pages stay mapped, counted in its RSS, until it exits. madvise(MADV_DONTNEED) on the binary's
// read-only mappings (code, read-only data, pc tables; never a writable one, whose pages hold
// state) unmaps them: they stay in the page cache, and what podgate uses again is mapped back
// on its next touch by a minor fault, without a disk read unless the kernel evicted it. It
// returns the binary's resident kilobytes before and after.
func releaseStartupPages() (before, after int64, err error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, 0, err
	}
	before, _ = residentFileKB()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		start, end, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(start, 16, 64)
		hi, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || hi <= lo {
			return before, 0, fmt.Errorf("/proc/self/maps: bad range %q", fields[0])
		}
		// The address comes from the kernel's own list of this process's mappings: no Go
		// pointer is involved, so the call takes it as a number.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(lo), uintptr(hi-lo), unix.MADV_DONTNEED); errno != 0 {
			return before, 0, fmt.Errorf("madvise %s: %w", fields[0], errno)
		}
	}
	if err := sc.Err(); err != nil {
		return before, 0, err
	}
	after, _ = residentFileKB()
	return before, after, nil
}

// residentFileKB is RssFile of /proc/self/status: the resident pages of mapped files, the
// binary's above all.
func residentFileKB() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no RssFile in /proc/self/status")
}
