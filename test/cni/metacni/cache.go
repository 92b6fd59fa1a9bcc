package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// cacheEntry is what ADD delegated for one container, kept so that DEL can undo it when podgate
// no longer knows the pod (DEL comes when the pod is being torn down, possibly after podgate
// forgot it, or after podgate restarted).
type cacheEntry struct {
	ContainerID string       `json:"containerID"`
	Netns       string       `json:"netns"`
	Pod         podRef       `json:"pod"`
	Delegations []delegation `json:"delegations"`
}

// cachePath is the cache file of a container. skel has validated the ID (letters, digits,
// '_', '.', '-'), which this checks again before making a path of it.
func cachePath(dir, containerID string) (string, error) {
	if containerID == "" || containerID == "." || containerID == ".." || filepath.Base(containerID) != containerID {
		return "", fmt.Errorf("container ID %q: not usable as a file name", containerID)
	}
	return filepath.Join(dir, containerID+".json"), nil
}

// writeCache stores e, replacing the container's previous entry (written to a temporary file
// and renamed, so DEL never reads half an entry).
func writeCache(dir string, e cacheEntry) error {
	path, err := cachePath(dir, e.ContainerID)
	if err != nil {
		return err
	}
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	return nil
}

// readCache returns the container's entry; ok is false when there is none.
func readCache(dir, containerID string) (_ cacheEntry, ok bool, _ error) {
	path, err := cachePath(dir, containerID)
	if err != nil {
		return cacheEntry{}, false, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return cacheEntry{}, false, nil
	}
	if err != nil {
		return cacheEntry{}, false, fmt.Errorf("cache: %w", err)
	}
	var e cacheEntry
	if err := json.Unmarshal(data, &e); err != nil {
		return cacheEntry{}, false, fmt.Errorf("cache %s: %w", path, err)
	}
	return e, true, nil
}

// removeCache deletes the container's entry; a missing one is fine.
func removeCache(dir, containerID string) error {
	path, err := cachePath(dir, containerID)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cache: %w", err)
	}
	return nil
}
