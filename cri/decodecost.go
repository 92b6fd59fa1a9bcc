package cri

// What decoding an intercepted request will hold, known before it is decoded: a walk of its
// wire bytes (protowire) along the request type's descriptors. A request's wire size says
// little of what it costs decoded: 15 MiB of empty repeated messages decode into 700 MB of Go
// structs (one pointer, one struct each). The walk counts each repeated field's and map's
// entries, refuses those no kubelet could send, and sums an upper bound of the allocations,
// which the call then holds against the relay's budget (relay.UnaryCall.Hold).

import (
	"fmt"
	"reflect"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Bounds on the entries of a request's repeated fields and maps, summed over the request (a
// field's path names it wherever it occurs). They are far above what a kubelet sends, and
// above what it could send at all:
const (
	// execEntries bounds a container's envs, args and command: execve(2) takes at most 6 MiB of
	// arguments and environment (Linux: 3/4 of _STK_LIM, fs/exec.c), each string costing its
	// pointer (8 bytes) and at least "K=" with its NUL (3 bytes), so no container with more could
	// start: 6 MiB / 11 = 571,950.
	execEntries = (6 << 20) / 11
	// groupEntries bounds supplemental groups: the kernel's NGROUPS_MAX.
	groupEntries = 65536
	// otherEntries bounds every other list and map (annotations, labels, mounts, devices, port
	// mappings, sysctls…): the pod's annotations may total 256 KiB (apimachinery's
	// TotalAnnotationSizeLimitB), a key at least 1 byte, so at most 262,144 entries; a pod's
	// other lists live in one Pod object, at most 1.5 MiB in etcd (its default
	// --max-request-bytes), where each entry takes at least 6 bytes, so at most 262,144 too.
	// Device lists come from a node's device plugins, far fewer.
	otherEntries = 1 << 18
)

// entryLimit is the bound on field fd's entries; fd is a list or a map.
func entryLimit(fd protoreflect.FieldDescriptor) int64 {
	switch fd.Name() {
	case "envs", "args", "command":
		return execEntries
	case "supplemental_groups":
		return groupEntries
	}
	return otherEntries
}

// What the Go protobuf runtime allocates, in bytes (64-bit), measured against runtime.MemStats
// by TestDecodeCostBoundsAllocations. A list is appended to one element at a time, and a large
// slice grows by 1.25×, so its backing arrays add up to 5× its final one, 6× with the
// allocator's rounding; unknown fields are appended to one []byte the same way. A packed list
// is counted first and allocated once. A map's table doubles as it grows, with a control byte
// per slot, 7/8 of its slots used, and what setting an entry through protoreflect costs.
const (
	growth       = 6  // what appending n elements allocates, in all, per element's size
	mapGrowth    = 3  // the same for a map's entries
	mapEntryWord = 32 // per map entry beside its key and value
)

// decodePlan is what the pre-scan knows of one request type, built once per method.
type decodePlan struct {
	root    *msgPlan
	counted []*fieldPlan // the lists and maps, by id
}

// msgPlan is one message type at one place in the request.
type msgPlan struct {
	size   int64 // its Go struct, as allocated
	fields map[protowire.Number]*fieldPlan
}

// fieldPlan is one field of a message at one place in the request.
type fieldPlan struct {
	path  string // from the request, e.g. "config.envs"
	kind  protoreflect.Kind
	list  bool
	id    int   // a list's or map's index in decodePlan.counted
	limit int64 // a list's or map's bound on entries
	elem  int64 // the bytes of one element in a list's slice, or one entry in a map's table
	grow  int64 // what adding one costs, in elem: growth or mapGrowth
	// box is what a field of a oneof (or a proto3 optional scalar) costs besides its value: the
	// wrapper struct (or pointer) Go holds it in.
	box int64
	msg *msgPlan // a message field's type; a map's entry (key 1, value 2)
}

// newDecodePlan walks md's fields, and theirs, once.
func newDecodePlan(md protoreflect.MessageDescriptor) *decodePlan {
	p := &decodePlan{}
	p.root = p.message(md, "", map[protoreflect.FullName]*msgPlan{})
	return p
}

// message plans md at path. inside holds the types being planned around it: a type that
// contains itself takes its outer plan (and path) again.
func (p *decodePlan) message(md protoreflect.MessageDescriptor, path string, inside map[protoreflect.FullName]*msgPlan) *msgPlan {
	if m, ok := inside[md.FullName()]; ok {
		return m
	}
	m := &msgPlan{size: structSize(md), fields: map[protowire.Number]*fieldPlan{}}
	inside[md.FullName()] = m
	defer delete(inside, md.FullName())
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		f := &fieldPlan{path: join(path, string(fd.Name())), kind: fd.Kind(), list: fd.IsList(), id: -1}
		switch {
		case fd.IsMap():
			f.elem, f.grow = goSize(fd.MapKey())+goSize(fd.MapValue())+mapEntryWord, mapGrowth
			f.msg = &msgPlan{fields: map[protowire.Number]*fieldPlan{
				1: p.single(fd.MapKey(), f.path, inside),
				2: p.single(fd.MapValue(), f.path, inside),
			}}
			f.kind = protoreflect.MessageKind
		case fd.IsList():
			f.elem, f.grow = goSize(fd), growth
			if fd.Message() != nil {
				f.msg = p.message(fd.Message(), f.path, inside)
			}
		default:
			f = p.single(fd, f.path, inside)
		}
		if fd.IsList() || fd.IsMap() {
			f.id, f.limit = len(p.counted), entryLimit(fd)
			p.counted = append(p.counted, f)
		}
		m.fields[fd.Number()] = f
	}
	return m
}

// single plans fd, a field that is not a list, at path.
func (p *decodePlan) single(fd protoreflect.FieldDescriptor, path string, inside map[protoreflect.FullName]*msgPlan) *fieldPlan {
	f := &fieldPlan{path: path, kind: fd.Kind(), id: -1}
	if fd.ContainingOneof() != nil {
		f.box = 32
	}
	if fd.Message() != nil {
		f.msg = p.message(fd.Message(), path, inside)
	}
	return f
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// structSize is the allocation of md's generated Go struct; a type not linked in (none of
// cri-api's) is given a generous 32 bytes per field.
func structSize(md protoreflect.MessageDescriptor) int64 {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		return allocSize(64 + 32*int64(md.Fields().Len()))
	}
	return allocSize(int64(reflect.TypeOf(mt.Zero().Interface()).Elem().Size()))
}

// goSize is the bytes of one fd value in a Go slice or map: a pointer for a message, a
// header for a string or bytes, the scalar's width otherwise.
func goSize(fd protoreflect.FieldDescriptor) int64 {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return 8
	case protoreflect.StringKind:
		return 16
	case protoreflect.BytesKind:
		return 24
	case protoreflect.BoolKind:
		return 1
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind, protoreflect.EnumKind,
		protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return 4
	}
	return 8
}

// allocSize is what the Go allocator hands out for n bytes, at most: its size classes waste
// up to 1/8, and a small object takes at least 8 bytes.
func allocSize(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return max(8, n+n/8+8)
}

// decodeScan is one walk of a request.
type decodeScan struct {
	plan   *decodePlan
	counts []int64 // entries, by the list's or map's id
	cost   int64
}

// decodeCost walks msg, a request of the plan's type, and returns an upper bound of what
// proto.Unmarshal allocates for it. A list or map with more entries than its bound is refused
// InvalidArgument naming it, as is a message that is not well-formed protobuf.
func (p *decodePlan) decodeCost(method string, msg []byte) (int64, error) {
	sc := &decodeScan{plan: p, counts: make([]int64, len(p.counted))}
	sc.cost = p.root.size
	if err := sc.message(p.root, msg, 0); err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "decode %s request: %v", method, err)
	}
	for _, f := range p.counted {
		if n := sc.counts[f.id]; n > f.limit {
			return 0, listTooLong{method: method, path: f.path, n: n, limit: f.limit}
		}
	}
	return sc.cost, nil
}

// listTooLong is a request whose list (or map) at path has more entries than any kubelet sends:
// InvalidArgument naming the field.
type listTooLong struct {
	method, path string
	n, limit     int64
}

func (e listTooLong) Error() string {
	return fmt.Sprintf("decode %s request: %s: %d entries, at most %d", e.method, e.path, e.n, e.limit)
}

// GRPCStatus makes it InvalidArgument (status.FromError).
func (e listTooLong) GRPCStatus() *status.Status { return status.New(codes.InvalidArgument, e.Error()) }

// maxDepth bounds the nesting the walk follows, as proto.Unmarshal's recursion limit does.
const maxDepth = 100

// message walks b, the fields of one message of plan m.
func (sc *decodeScan) message(m *msgPlan, b []byte, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested more than %d deep", maxDepth)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return protowire.ParseError(vn)
		}
		f := m.fields[num]
		if f == nil || !sc.field(f, typ, b[n:n+vn]) {
			// Unknown (or of another wire type): kept as bytes, appended to the message's own.
			sc.cost += growth * int64(n+vn)
		} else if f.msg != nil && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n : n+vn])
			if err := sc.message(f.msg, v, depth+1); err != nil {
				return err
			}
		}
		b = b[n+vn:]
	}
	return nil
}

// field counts one occurrence of f, of wire type typ and value v, and adds what decoding it
// allocates besides the fields of a message value, which message walks. It says whether the
// field is f as planned, not an unknown field.
func (sc *decodeScan) field(f *fieldPlan, typ protowire.Type, v []byte) bool {
	wantBytes := f.msg != nil || f.kind == protoreflect.StringKind || f.kind == protoreflect.BytesKind
	packed := f.list && !wantBytes && typ == protowire.BytesType
	if wantBytes != (typ == protowire.BytesType) && !packed {
		return false
	}
	if packed {
		b, _ := protowire.ConsumeBytes(v)
		n := packedCount(f.kind, b)
		sc.counts[f.id] += n
		sc.cost += allocSize(f.elem * n)
		return true
	}
	if f.id >= 0 {
		sc.counts[f.id]++
		sc.cost += f.grow * f.elem
	}
	sc.cost += f.box
	switch {
	case f.msg != nil:
		sc.cost += f.msg.size
	case wantBytes:
		b, _ := protowire.ConsumeBytes(v)
		sc.cost += allocSize(int64(len(b)))
	}
	return true
}

// packedCount is how many values of kind b, a packed list, holds; an upper bound when b is
// malformed, which decoding then refuses.
func packedCount(kind protoreflect.Kind, b []byte) int64 {
	switch kind {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return int64(len(b)+3) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return int64(len(b)+7) / 8
	}
	var n int64
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}
