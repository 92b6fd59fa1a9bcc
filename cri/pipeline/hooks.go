package pipeline

import (
	"google.golang.org/protobuf/proto"

	"github.com/podgate/podgate/cri"
)

// Hook is one feature's part in one CRI method other than the sandbox pipeline's. A method's
// hooks are listed outermost first: the first hook's "before" runs first and its "after"
// last, as with nested calls. A hook may refuse the call before it is forwarded (nothing
// reaches the runtime), wait, change the request, or act on the answer.
type Hook[Req, Resp proto.Message] struct {
	// Feature names the feature (sysctl, resources, image-pulls), for logs and docs.
	Feature string
	// Before and After say what it does before forwarding and with the answer.
	Before, After string
	Fn            cri.Interceptor[Req, Resp]
	// ReadOnly: Fn changes neither the request nor the answer. A method whose hooks all only
	// read is forwarded as the kubelet sent it and answered as the runtime did, without the
	// copies and comparisons that finding a change costs (cri.Observe).
	ReadOnly bool
}

// Intercept plugs a method's hooks into the CRI server, in the table's order.
func Intercept[Req, Resp proto.Message](s *cri.Server, m cri.Method[Req, Resp], hooks []Hook[Req, Resp]) {
	for _, h := range hooks {
		if h.ReadOnly {
			cri.Observe(s, m, h.Fn)
		} else {
			cri.Intercept(s, m, h.Fn)
		}
	}
}
