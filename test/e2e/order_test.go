package e2e

import (
	"math/rand/v2"
	"testing"
)

// roundOrder is the order in which a benchmark's round iter calls its paths: a permutation
// drawn afresh for each round (seeded by the round, so a run can be repeated), so that over the
// rounds every path goes first, and follows every other, as often as any. The call before a
// path's matters on two shared CPUs: the process that served it may still hold one (Go's
// threads spin for a while before they sleep). A rotation alone lets each path go first as
// often, but always behind the same neighbour: two runs of the same podgate binary differed
// by 6–18 µs at p50 that way, the one behind test/forwarder slower.
func roundOrder(iter int, paths []string) []string {
	r := rand.New(rand.NewPCG(uint64(iter), 0x9e3779b97f4a7c15)) //nolint:gosec // an order, not a secret
	out := make([]string, len(paths))
	for i, j := range r.Perm(len(paths)) {
		out[i] = paths[j]
	}
	return out
}

// Over the rounds, each path goes first, and follows each other path (within a round and from
// one round's last call to the next round's first), about as often as any.
func TestRoundOrderBalanced(t *testing.T) {
	paths := []string{"direct", "bytes", "forwarder", "podgate", "before"}
	const rounds = 3000
	first := map[string]int{}
	follows := map[[2]string]int{}
	prev := ""
	for iter := range rounds {
		order := roundOrder(iter, paths)
		if len(order) != len(paths) {
			t.Fatalf("round %d: %d paths, want %d", iter, len(order), len(paths))
		}
		seen := map[string]bool{}
		for _, p := range order {
			if seen[p] {
				t.Fatalf("round %d calls %s twice: %v", iter, p, order)
			}
			seen[p] = true
			if prev != "" {
				follows[[2]string{prev, p}]++
			}
			prev = p
		}
		first[order[0]]++
	}
	wantFirst := rounds / len(paths)
	for _, p := range paths {
		if n := first[p]; n < wantFirst*8/10 || n > wantFirst*12/10 {
			t.Errorf("%s first in %d rounds, want about %d", p, n, wantFirst)
		}
	}
	// rounds·len(paths)−1 successions over len(paths)·(len(paths)−1) ordered pairs.
	wantPair := (rounds*len(paths) - 1) / (len(paths) * (len(paths) - 1))
	for _, a := range paths {
		for _, b := range paths {
			if a == b {
				continue
			}
			if n := follows[[2]string{a, b}]; n < wantPair*8/10 || n > wantPair*12/10 {
				t.Errorf("%s follows %s %d times, want about %d", b, a, n, wantPair)
			}
		}
	}
	// The same round gives the same order: a run can be repeated.
	if a, b := roundOrder(7, paths), roundOrder(7, paths); a[0] != b[0] || a[4] != b[4] {
		t.Errorf("round 7 gave %v, then %v", a, b)
	}
}
