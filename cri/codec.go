package cri

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// frame is one gRPC message carried as the bytes it arrived in. The proxy's codec hands a frame's
// buffers through without copying or decoding them.
type frame struct {
	data mem.BufferSlice
}

// frameOf wraps bytes the caller owns (and will not change) as a frame.
func frameOf(b []byte) *frame {
	return &frame{data: mem.BufferSlice{mem.SliceBuffer(b)}}
}

// bytes returns the frame's content, copying only when it spans several buffers.
func (f *frame) bytes() []byte {
	if len(f.data) == 1 {
		return f.data[0].ReadOnlyData()
	}
	return f.data.Materialize()
}

// free returns the frame's buffers to grpc's pool when the frame will not be sent.
func (f *frame) free() {
	f.data.Free()
	f.data = nil
}

// rawCodec marshals frames as their bytes and every other message as protobuf. Both the server
// and the backend connections use it, so a passthrough call is bytes in, bytes out. It keeps the
// name "proto" so the wire content type stays application/grpc+proto.
type rawCodec struct {
	proto encoding.CodecV2
}

func newRawCodec() rawCodec {
	return rawCodec{proto: encoding.GetCodecV2(proto.Name)}
}

func (c rawCodec) Name() string { return proto.Name }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		// grpc frees what Marshal returns once it is written: hand over the frame's reference.
		data := f.data
		f.data = nil
		return data, nil
	}
	return c.proto.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		// grpc frees data when Unmarshal returns: keep a reference for the forwarding side.
		data.Ref()
		f.data = data
		return nil
	}
	if v == nil {
		return fmt.Errorf("unmarshal into nil")
	}
	return c.proto.Unmarshal(data, v)
}
