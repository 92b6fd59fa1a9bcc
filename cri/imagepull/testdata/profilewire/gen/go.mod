module github.com/podgate/podgate/cri/imagepull/testdata/profilewire/gen

go 1.27.0

require (
	google.golang.org/protobuf v1.36.12
	k8s.io/cri-api v0.38.0-beta.0
)

require (
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/grpc v1.85.0 // indirect
)
