package registry

// What a registry that rate-limits answers: every manifest and blob request refused with 429
// Too Many Requests (or 503) until the test lets them through again.

import (
	"encoding/json"
	"net/http"
	"time"
)

// refusal is how the registry refuses requests while Refuse is in force.
type refusal struct {
	status     int
	retryAfter string
}

// Refuse answers every GET and HEAD of a manifest or a blob with status (429 Too Many
// Requests, 503 Service Unavailable) until Allow, as a registry enforcing a rate limit does: a
// GET gets the distribution spec's error body (code TOOMANYREQUESTS for a 429, UNAVAILABLE
// otherwise, the message Docker Hub sends with its pull limit), a HEAD none; retryAfter, unless
// "", is sent as the Retry-After header and quoted in the message, as GHCR quotes it. As the
// throttle, it applies to what the registry counts (Count(true)), never to pushes; each refused
// request is in the request log with its status (Request.Refused) and counted nowhere else.
func (r *Registry) Refuse(status int, retryAfter string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusing = &refusal{status: status, retryAfter: retryAfter}
}

// Allow serves requests again after Refuse.
func (r *Registry) Allow() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusing = nil
}

// refuseIfRefusing answers req with the refusal in force and logs it, reporting whether it did.
func (r *Registry) refuseIfRefusing(w http.ResponseWriter, req *http.Request, entry Request) bool {
	r.mu.Lock()
	ref := r.refusing
	r.mu.Unlock()
	if ref == nil {
		return false
	}
	code, message := "UNAVAILABLE", "service unavailable"
	if ref.status == http.StatusTooManyRequests {
		code, message = "TOOMANYREQUESTS", "You have reached your pull rate limit."
	}
	if ref.retryAfter != "" {
		w.Header().Set("Retry-After", ref.retryAfter)
		message += " retry-after: " + ref.retryAfter + "s"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ref.status)
	if req.Method == http.MethodGet {
		body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": code, "message": message}}})
		_, _ = w.Write(body) // a puller gone has nothing to hear of it
	}
	entry.End, entry.Refused = time.Now(), ref.status
	r.mu.Lock()
	r.log = append(r.log, entry)
	r.mu.Unlock()
	return true
}

// RefusedByRepo counts the requests of the log refused (Refuse), by repository.
func RefusedByRepo(log []Request) map[string]int {
	out := map[string]int{}
	for _, q := range log {
		if q.Refused != 0 {
			out[q.Repo]++
		}
	}
	return out
}
