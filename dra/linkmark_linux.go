package dra

// The mark podgate leaves in an interface's alias while the interface is in a pod, and finding
// interfaces by it.

import (
	"encoding/json"
	"errors"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
)

// attachedFrom records what link is on the host. A link that carries podgate's mark (an
// Attach that stopped after marking it) has it from the mark.
func attachedFrom(link netlink.Link) Attached {
	attrs := link.Attrs()
	if mark, ok := parseLinkMark(attrs.Alias); ok && mark.Name == attrs.Name {
		return attachedFromMark(mark)
	}
	return Attached{HostName: attrs.Name, MTU: attrs.MTU, Up: attrs.Flags&net.FlagUp != 0, Alias: attrs.Alias}
}

// findMarked returns the link of h's namespace marked as hostName's: the one named name if it
// is, else any. nil when there is none.
func findMarked(h *netlink.Handle, name, hostName string) (netlink.Link, linkMark, error) {
	link, err := h.LinkByName(name)
	if err != nil && !isLinkNotFound(err) {
		return nil, linkMark{}, err
	}
	if link != nil {
		if mark, ok := parseLinkMark(link.Attrs().Alias); ok && mark.Name == hostName {
			return link, mark, nil
		}
	}
	links, err := ListLinks(h)
	if err != nil {
		return nil, linkMark{}, err
	}
	for _, l := range links {
		if mark, ok := parseLinkMark(l.Attrs().Alias); ok && mark.Name == hostName {
			return l, mark, nil
		}
	}
	return nil, linkMark{}, nil
}

// ListLinks lists the interfaces of h's network namespace (nil: the caller's). A dump the kernel
// interrupted because interfaces changed meanwhile (other pods' veths coming and going) is
// asked again, up to three times, rather than read half.
func ListLinks(h *netlink.Handle) ([]netlink.Link, error) {
	list := netlink.LinkList
	if h != nil {
		list = h.LinkList
	}
	links, err := list()
	for attempt := 0; errors.Is(err, netlink.ErrDumpInterrupted) && attempt < 3; attempt++ {
		links, err = list()
	}
	return links, err
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// linkMarkPrefix starts the alias podgate gives an interface while it is in a pod: the alias
// moves with the interface, and tells podgate which interface is its and how to give it back,
// even after a crash before its checkpoint, or when the kernel returned it to the host.
const linkMarkPrefix = "podgate:"

// maxAliasLen is the longest alias the kernel keeps (IFALIASZ less the NUL).
const maxAliasLen = 255

// linkMark is what the mark records of the interface on the host.
type linkMark struct {
	Name  string `json:"name"`
	MTU   int    `json:"mtu"`
	Up    bool   `json:"up,omitempty"`
	Alias string `json:"alias,omitempty"`
}

// attachedFromMark is what a mark says of the interface on the host.
func attachedFromMark(m linkMark) Attached {
	return Attached{HostName: m.Name, MTU: m.MTU, Up: m.Up, Alias: m.Alias}
}

func markOf(a Attached) linkMark {
	return linkMark{Name: a.HostName, MTU: a.MTU, Up: a.Up, Alias: a.Alias}
}

// alias returns the mark as an alias; without the host alias when that would not fit.
func (m linkMark) alias() string {
	b, _ := json.Marshal(m) // cannot fail: strings, a number and a bool
	if len(linkMarkPrefix)+len(b) > maxAliasLen {
		m.Alias = ""
		b, _ = json.Marshal(m)
	}
	return linkMarkPrefix + string(b)
}

func parseLinkMark(alias string) (linkMark, bool) {
	rest, ok := strings.CutPrefix(alias, linkMarkPrefix)
	if !ok {
		return linkMark{}, false
	}
	var m linkMark
	if err := json.Unmarshal([]byte(rest), &m); err != nil || m.Name == "" {
		return linkMark{}, false
	}
	return m, true
}
