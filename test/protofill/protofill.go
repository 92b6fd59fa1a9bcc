// Package protofill sets every field of a protobuf message, for tests that must show a piece of
// code leaves a message as it came (a CRI hook that says it only reads): a field left unset
// could hide a change.
package protofill

import (
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds the nesting filled, so that recursive message types end.
const maxDepth = 6

// Fill sets every field of m, nested messages, lists and maps included (to depth 6), each to a
// value of its own.
func Fill(m protoreflect.Message) { fill(m, 0) }

func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			v := mp.NewValue()
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				if depth < maxDepth {
					fill(v.Message(), depth+1)
				}
			} else {
				v = scalar(fd.MapValue(), i)
			}
			mp.Set(scalar(fd.MapKey(), i).MapKey(), v)
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
				if depth < maxDepth {
					v := l.NewElement()
					fill(v.Message(), depth+1)
					l.Append(v)
				}
				continue
			}
			l.Append(scalar(fd, i))
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if depth < maxDepth {
				fill(m.Mutable(fd).Message(), depth+1)
			}
		default:
			m.Set(fd, scalar(fd, i))
		}
	}
}

// scalar is a non-zero value of fd's kind, told apart by i.
func scalar(fd protoreflect.FieldDescriptor, i int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(i + 1))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(i + 1))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(i + 1))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(i + 1))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(i) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(i) + 0.5)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(i + 1)})
	}
	return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), i))
}
