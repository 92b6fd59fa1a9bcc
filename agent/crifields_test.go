package agent

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// criField is a field that a later cri-api adds to a message podgate's cri-api (v0.37) knows:
// to podgate it is an unknown field, which it must carry byte for byte.
type criField struct {
	msg  protoreflect.FullName // the message that holds it
	name string
	raw  []byte // the field as a later kubelet or runtime writes it: its tag and its value
}

// criV038Fields are the fields cri-api v0.38.0-beta.0 adds to messages of v0.37.2: every
// addition of its api.proto (pkg/apis/runtime/v1) but the new messages of the security-profile
// calls, written with protowire at the beta's field numbers and wire types as the v0.38
// encoder writes them. Each is its message's highest field number, so a v0.38 encoder writes it
// last, where a v0.37 encoder writes the unknown fields it carries: the same bytes.
var criV038Fields = []criField{
	// NamespaceOption.cgroupns_options = 6: CgroupNamespace{mode = 1}, NamespaceMode CONTAINER.
	{"runtime.v1.NamespaceOption", "cgroupns_options", protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType),
		protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1))},
	// SecurityProfile.oci_ref = 3: the digest-pinned reference of a pulled profile.
	{"runtime.v1.SecurityProfile", "oci_ref", protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType),
		"registry.example/profiles/strict@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")},
	// SecurityProfile.base_profile = 4: SecurityProfileBase{type = 1 (Localhost), localhost_ref = 2}.
	{"runtime.v1.SecurityProfile", "base_profile", protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType),
		protowire.AppendString(protowire.AppendTag(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1), 2, protowire.BytesType),
			"/var/lib/kubelet/seccomp/base.json"))},
	// LinuxContainerSecurityContext.cgroup_mount_mode = 18: CGROUP_MOUNT_MODE_READ_ONLY (1).
	{"runtime.v1.LinuxContainerSecurityContext", "cgroup_mount_mode", protowire.AppendVarint(protowire.AppendTag(nil, 18, protowire.VarintType), 1)},
	// RuntimeHandlerFeatures.cgroup_namespaces = 3, in Status answers.
	{"runtime.v1.RuntimeHandlerFeatures", "cgroup_namespaces", protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 1)},
	// RuntimeFeatures.cgroup_mount_mode = 4 and seccomp_profile_oci = 5, in Status answers.
	{"runtime.v1.RuntimeFeatures", "cgroup_mount_mode", protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1)},
	{"runtime.v1.RuntimeFeatures", "seccomp_profile_oci", protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.VarintType), 1)},
	// Metric.double_value = 6: DoubleValue{value = 1}, a fractional metric (0.25), in metrics
	// answers.
	{"runtime.v1.Metric", "double_value", protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType),
		protowire.AppendFixed64(protowire.AppendTag(nil, 1, protowire.Fixed64Type), math.Float64bits(0.25)))},
}

// The other change of v0.38 in a message podgate's cri-api knows: a new value of a known enum,
// SecurityProfile.ProfileType OCI = 3 (a profile pulled with PullSecurityProfile), which the
// kubelet sends in SecurityProfile.profile_type (field 1). A v0.37 message holds it as the
// number it is.
const (
	profileTypeField = "profile_type"
	profileTypeOCI   = protoreflect.EnumNumber(3)
)

// futureField is a field no cri-api has yet, at the top of a message no v0.38 field reaches: a
// request or an answer podgate intercepts must carry it too.
var futureField = protowire.AppendString(protowire.AppendTag(nil, 9999, protowire.BytesType), "a field of a later cri-api")

// checkFieldsUnknown fails the test when podgate's cri-api knows a field of criV038Fields, or
// the OCI profile type: then the fields are no longer carried as unknown fields, and the test
// must set them through their types.
func checkFieldsUnknown(t *testing.T) {
	t.Helper()
	for _, f := range criV038Fields {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(f.msg)
		if err != nil {
			t.Fatal(err)
		}
		num, _, _ := protowire.ConsumeTag(f.raw)
		if known := d.(protoreflect.MessageDescriptor).Fields().ByNumber(num); known != nil {
			t.Fatalf("podgate's cri-api knows %s field %d (%s): set it through its type", f.msg, num, known.Name())
		}
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName("runtime.v1.SecurityProfile.ProfileType")
	if err != nil {
		t.Fatal(err)
	}
	if v := d.(protoreflect.EnumDescriptor).Values().ByNumber(profileTypeOCI); v != nil {
		t.Fatalf("podgate's cri-api knows SecurityProfile.ProfileType %d (%s): set it through its type", profileTypeOCI, v.Name())
	}
}

// newFieldsOf are the fields of criV038Fields that a message of type md holds itself.
func newFieldsOf(md protoreflect.MessageDescriptor) []criField {
	var out []criField
	for _, f := range criV038Fields {
		if f.msg == md.FullName() {
			out = append(out, f)
		}
	}
	return out
}

// reaches tells whether a message of type md holds a field of criV038Fields, itself or in a
// message field (or list of messages) at any depth. No path to them goes through a map or a
// oneof in v0.37 (TestCRIv038FieldsCarried finds the paths).
func reaches(md protoreflect.MessageDescriptor) bool {
	return reachesFrom(md, map[protoreflect.FullName]bool{})
}

func reachesFrom(md protoreflect.MessageDescriptor, inside map[protoreflect.FullName]bool) bool {
	if len(newFieldsOf(md)) > 0 || md.FullName() == "runtime.v1.SecurityProfile" {
		return true
	}
	if inside[md.FullName()] {
		return false
	}
	inside[md.FullName()] = true
	defer delete(inside, md.FullName())
	fields := md.Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && reachesFrom(fd.Message(), inside) {
			return true
		}
	}
	return false
}

// addNewFields writes every field of criV038Fields into m wherever its type can hold one,
// making the messages on the way (one element of an empty list), and the OCI profile type into
// each SecurityProfile. It returns the paths it wrote at ("config.linux.security_context.seccomp").
func addNewFields(m protoreflect.Message, path string) []string {
	var at []string
	md := m.Descriptor()
	if fs := newFieldsOf(md); len(fs) > 0 {
		u := m.GetUnknown()
		for _, f := range fs {
			u = append(u, f.raw...)
		}
		m.SetUnknown(u)
		at = append(at, path)
	}
	if md.FullName() == "runtime.v1.SecurityProfile" {
		m.Set(md.Fields().ByName(profileTypeField), protoreflect.ValueOfEnum(profileTypeOCI))
		if len(newFieldsOf(md)) == 0 {
			at = append(at, path)
		}
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !reaches(fd.Message()) {
			continue
		}
		p := join(path, string(fd.Name()))
		if !fd.IsList() {
			at = append(at, addNewFields(m.Mutable(fd).Message(), p)...)
			continue
		}
		l := m.Mutable(fd).List()
		if l.Len() == 0 {
			l.Append(l.NewElement())
		}
		for j := range l.Len() {
			at = append(at, addNewFields(l.Get(j).Message(), p+"[]")...)
		}
	}
	return at
}

// newFieldsIn checks that m holds, at every path where addNewFields wrote them, the fields of
// criV038Fields byte for byte as its unknown fields, and the OCI profile type; it returns a
// description of each difference.
func newFieldsIn(m protoreflect.Message, path string) []string {
	var bad []string
	md := m.Descriptor()
	if fs := newFieldsOf(md); len(fs) > 0 {
		var want []byte
		for _, f := range fs {
			want = append(want, f.raw...)
		}
		if got := m.GetUnknown(); !bytes.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("at %s: the new fields' bytes %x, want %x", path, got, want))
		}
	}
	if md.FullName() == "runtime.v1.SecurityProfile" {
		if got := m.Get(md.Fields().ByName(profileTypeField)).Enum(); got != profileTypeOCI {
			bad = append(bad, fmt.Sprintf("at %s: profile_type %d, want OCI (3)", path, got))
		}
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !reaches(fd.Message()) {
			continue
		}
		p := join(path, string(fd.Name()))
		if !m.Has(fd) {
			bad = append(bad, "at "+p+": missing")
			continue
		}
		if !fd.IsList() {
			bad = append(bad, newFieldsIn(m.Get(fd).Message(), p)...)
			continue
		}
		l := m.Get(fd).List()
		for j := range l.Len() {
			bad = append(bad, newFieldsIn(l.Get(j).Message(), p+"[]")...)
		}
	}
	return bad
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
