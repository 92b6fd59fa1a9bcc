package config

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// CRISocketLimits defaults: config's own copies of relay.DefaultLimits, so that config imports
// no infrastructure it need not (agent's tests hold them equal); the relay applies them to the
// keys left unset, which `podgate config defaults` does not print. A kubelet never reaches them: its largest request
// is a few KiB, its header blocks a few hundred bytes, and it calls the runtime every second
// or so.
const (
	DefaultCRIConnectionBytes    = 64 << 20
	DefaultCRITotalBytes         = 256 << 20
	DefaultCRIMaxConnections     = 4096
	DefaultCRIMaxHeaderListBytes = 64 << 10
	DefaultCRIIdleTimeout        = 5 * time.Minute
	DefaultCRIKeepaliveTime      = 2 * time.Minute
	DefaultCRIKeepaliveTimeout   = 20 * time.Second
	DefaultCRIRequestTimeout     = 2 * time.Minute
	DefaultCRIWriteTimeout       = 20 * time.Second
	DefaultCRIWindowTimeout      = time.Minute
)

// CRISocketLimits is the criSocketLimits section: what one local client of the CRI socket can
// make podgate hold, and for how long, so that no client can take the socket every pod
// depends on down. Over a limit, podgate refuses the call or closes the connection, logs the
// client once and counts it (podgate_cri_connection_refusals_total). A key left unset (or 0)
// takes its default.
type CRISocketLimits struct {
	// ConnectionBytes bounds the bytes one connection makes podgate hold for requests it has
	// not handed on yet (intercepted requests until their end, the header blocks of open calls,
	// request bytes waiting for the runtime). Default 64 MiB.
	ConnectionBytes int64 `json:"connectionBytes,omitempty"`
	// TotalBytes bounds the same over every connection; over it, the connections that are stuck
	// (requests not finished, answers not taken) are closed, the longest stuck first, and a
	// call of a connection that holds more than a little is refused. Default 256 MiB.
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// MaxConnections bounds the connections open at once; one over it is closed as it is
	// accepted. Default 4096.
	MaxConnections int `json:"maxConnections,omitempty"`
	// MaxHeaderListBytes is the SETTINGS_MAX_HEADER_LIST_SIZE podgate announces and holds a
	// call's header block to, counted as it is decoded. Default 64 KiB.
	MaxHeaderListBytes int64 `json:"maxHeaderListBytes,omitempty"`
	// IdleTimeout closes a connection without a call open for so long. Default 5m.
	IdleTimeout Duration `json:"idleTimeout,omitzero"`
	// KeepaliveTime is how long a client may send nothing before podgate PINGs it, and
	// KeepaliveTimeout how long it then has to answer. Default 2m and 20s.
	KeepaliveTime    Duration `json:"keepaliveTime,omitzero"`
	KeepaliveTimeout Duration `json:"keepaliveTimeout,omitzero"`
	// RequestTimeout bounds how long a call without a grpc-timeout may take to send its whole
	// request. Default 2m.
	RequestTimeout Duration `json:"requestTimeout,omitzero"`
	// WriteTimeout closes a connection whose client took no byte of what podgate wrote to it
	// for so long (it stopped reading its socket). Default 20s.
	WriteTimeout Duration `json:"writeTimeout,omitzero"`
	// WindowTimeout resets a call whose answer waited so long on the client's shut
	// flow-control window, no byte leaving. Default 1m.
	WindowTimeout Duration `json:"windowTimeout,omitzero"`
}

// effective is l with each unset (zero) key at its default, as the CRI socket applies them;
// the file and `podgate config defaults` leave them unset.
func (l CRISocketLimits) effective() CRISocketLimits {
	l.ConnectionBytes = cmp.Or(l.ConnectionBytes, DefaultCRIConnectionBytes)
	l.TotalBytes = cmp.Or(l.TotalBytes, DefaultCRITotalBytes)
	l.MaxHeaderListBytes = cmp.Or(l.MaxHeaderListBytes, DefaultCRIMaxHeaderListBytes)
	l.MaxConnections = cmp.Or(l.MaxConnections, DefaultCRIMaxConnections)
	l.IdleTimeout.Duration = cmp.Or(l.IdleTimeout.Duration, DefaultCRIIdleTimeout)
	l.KeepaliveTime.Duration = cmp.Or(l.KeepaliveTime.Duration, DefaultCRIKeepaliveTime)
	l.KeepaliveTimeout.Duration = cmp.Or(l.KeepaliveTimeout.Duration, DefaultCRIKeepaliveTimeout)
	l.RequestTimeout.Duration = cmp.Or(l.RequestTimeout.Duration, DefaultCRIRequestTimeout)
	l.WriteTimeout.Duration = cmp.Or(l.WriteTimeout.Duration, DefaultCRIWriteTimeout)
	l.WindowTimeout.Duration = cmp.Or(l.WindowTimeout.Duration, DefaultCRIWindowTimeout)
	return l
}

// The bounds a limit must stay within: below them a kubelet's own calls would be refused.
const (
	minCRIConnectionBytes    = 1 << 20
	minCRIMaxHeaderListBytes = 4 << 10
	maxCRIMaxHeaderListBytes = 16 << 20 // grpc-go's default
	minCRITimeout            = time.Second
)

func (l *CRISocketLimits) validate() error {
	var errs []error
	eff := l.effective() // a key left unset is checked at its default, against the others
	l = &eff
	if l.ConnectionBytes < minCRIConnectionBytes {
		errs = append(errs, fmt.Errorf("criSocketLimits.connectionBytes: %d: must be at least %d (1 MiB)", l.ConnectionBytes, minCRIConnectionBytes))
	}
	if l.TotalBytes < l.ConnectionBytes {
		errs = append(errs, fmt.Errorf("criSocketLimits.totalBytes: %d: must be at least connectionBytes (%d)", l.TotalBytes, l.ConnectionBytes))
	}
	if l.MaxConnections < 1 {
		errs = append(errs, fmt.Errorf("criSocketLimits.maxConnections: %d: must be at least 1", l.MaxConnections))
	}
	if l.MaxHeaderListBytes < minCRIMaxHeaderListBytes || l.MaxHeaderListBytes > maxCRIMaxHeaderListBytes {
		errs = append(errs, fmt.Errorf("criSocketLimits.maxHeaderListBytes: %d: must be from %d (4 KiB) to %d (16 MiB)", l.MaxHeaderListBytes, minCRIMaxHeaderListBytes, maxCRIMaxHeaderListBytes))
	} else if l.MaxHeaderListBytes > l.ConnectionBytes {
		errs = append(errs, fmt.Errorf("criSocketLimits.maxHeaderListBytes: %d: must not be above connectionBytes (%d)", l.MaxHeaderListBytes, l.ConnectionBytes))
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"idleTimeout", l.IdleTimeout}, {"keepaliveTime", l.KeepaliveTime}, {"keepaliveTimeout", l.KeepaliveTimeout}, {"requestTimeout", l.RequestTimeout},
		{"writeTimeout", l.WriteTimeout}, {"windowTimeout", l.WindowTimeout}} {
		if d.v.Duration < minCRITimeout {
			errs = append(errs, fmt.Errorf("criSocketLimits.%s: %s: must be at least 1s", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}
