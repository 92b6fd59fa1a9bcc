package endpoint

import (
	"fmt"
	"strings"
)

// Parse accepts "unix:///abs/path" or "/abs/path" and returns the socket path.
func Parse(endpoint string) (string, error) {
	path := endpoint
	if rest, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		path = rest
	} else if strings.Contains(endpoint, "://") {
		return "", fmt.Errorf("%q: only unix sockets are supported (unix:///path or /path)", endpoint)
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("%q: want an absolute socket path (unix:///path or /path)", endpoint)
	}
	if len(path) > 107 {
		return "", fmt.Errorf("%q: socket path is %d bytes, unix sockets allow 107", endpoint, len(path))
	}
	return path, nil
}
