package imagepull

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPushBackOf: a registry's push-back is read from containerd's real error texts, as the
// kubelet gets them through the CRI (a gRPC status, code Unknown, the text its message): 429
// always, 503 only with a Retry-After the text shows; every other failure is not one.
func TestPushBackOf(t *testing.T) {
	const pullPrefix = `failed to pull and unpack image "%[1]s": failed to resolve reference "%[1]s": `
	cri := func(image, text string) error {
		return status.Error(codes.Unknown, fmt.Sprintf(pullPrefix, image)+text)
	}
	tests := []struct {
		name       string
		err        error
		want       bool
		code       int
		retryAfter time.Duration
	}{
		// containerd 2.x, a 429 to the resolver's HEAD, which has no body (DESIGN's verified
		// form, seen on the rig with a loopback registry).
		{"2.x HEAD", cri("127.0.0.1:5000/e2e/img0:v1",
			"unexpected status from HEAD request to http://127.0.0.1:5000/v2/e2e/img0/manifests/v1: 429 Too Many Requests"), true, 429, 0},
		// containerd 2.4.2's transfer service, as it answered the rig's CRI PullImage from a
		// loopback registry refusing every request (TestImagePullThrottledGivesUp), verbatim.
		{"2.4.2 resolve image", status.Error(codes.Unknown, `failed to pull and unpack image "127.0.0.1:44687/refused/img0:v1": failed to resolve image: unexpected status from HEAD request to http://127.0.0.1:44687/v2/refused/img0/manifests/v1: 429 Too Many Requests`), true, 429, 0},
		// containerd 1.x's fetcher, Docker Hub's pull-rate limit (kubernetes#17118 and the
		// issues that quote it).
		{"1.x GET Docker Hub", cri("docker.io/library/busybox:latest",
			"unexpected status code https://registry-1.docker.io/v2/library/busybox/manifests/sha256:4be429a5fbb2e71ae7958bfa558bc637cf3a61baf40a708cb8fff532b39e52d0: 429 Too Many Requests - Server message: toomanyrequests: You have reached your pull rate limit. You may increase the limit by authenticating and upgrading: https://www.docker.com/increase-rate-limit"), true, 429, 0},
		// containerd 2.x, a GET whose body is the registry's error list: errors.Join puts it on
		// a line of its own (remotes/docker unexpectedResponseErr). GHCR says how long to wait.
		{"2.x GET GHCR with retry-after", cri("ghcr.io/org/app:1",
			"unexpected status from GET request to https://ghcr.io/v2/org/app/manifests/1: 429 Too Many Requests\ntoomanyrequests: retry-after: 333.939671ms, allowed: 44000/minute"), true, 429, 333939671 * time.Nanosecond},
		// A blob fetch refused with the older fetcher's text, microseconds rounded up to a
		// millisecond.
		{"blob GET retry-after in µs", errors.New("failed to copy: httpReadSeeker: failed open: unexpected status code https://ghcr.io/v2/org/app/blobs/sha256:f6d2: 429 Too Many Requests - Server message: toomanyrequests: retry-after: 985.86µs, allowed: 44000/minute"), true, 429, time.Millisecond},
		// The token endpoint's refusal is the registry's too.
		{"token endpoint", cri("docker.io/library/nginx:1",
			"failed to authorize: failed to fetch anonymous token: unexpected status from GET request to https://auth.docker.io/token?scope=repository%3Alibrary%2Fnginx%3Apull&service=registry.docker.io: 429 Too Many Requests"), true, 429, 0},
		{"503 with Retry-After seconds", cri("quay.io/org/app:1",
			"unexpected status from GET request to https://quay.io/v2/org/app/manifests/1: 503 Service Unavailable\nunavailable: Retry-After: 30"), true, 503, 30 * time.Second},
		{"503 without Retry-After", cri("quay.io/org/app:1",
			"unexpected status from HEAD request to https://quay.io/v2/org/app/manifests/1: 503 Service Unavailable"), false, 0, 0},
		{"500", cri("quay.io/org/app:1",
			"unexpected status from HEAD request to https://quay.io/v2/org/app/manifests/1: 500 Internal Server Error"), false, 0, 0},
		{"401", cri("127.0.0.1:5000/private/app:1",
			"pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials"), false, 0, 0},
		{"403 naming 429 in the path", cri("127.0.0.1:5000/app429:429",
			"unexpected status from HEAD request to http://127.0.0.1:5000/v2/app429/manifests/429: 403 Forbidden"), false, 0, 0},
		{"not found", cri("127.0.0.1:5000/e2e/img0:v429",
			"127.0.0.1:5000/e2e/img0:v429: not found"), false, 0, 0},
		{"cancelled", status.Error(codes.Canceled, "context canceled"), false, 0, 0},
		{"nil", nil, false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pb, ok := pushBackOf(tt.err)
			if ok != tt.want || pb.code != tt.code || pb.retryAfter != tt.retryAfter {
				t.Errorf("pushBackOf = %+v, %v; want code %d, retry-after %s, %v", pb, ok, tt.code, tt.retryAfter, tt.want)
			}
		})
	}
}
