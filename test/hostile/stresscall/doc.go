// Package stresscall is the call of the write path's stress test (test/hostile): a request
// that says what answer it wants (its size, in how many messages, the sizes of its header and
// trailer metadata) and carries a payload and a request header, every byte of them made from
// one seed. The runtime (test/e2e/fakeruntime -stress, Serve) checks the request's bytes and
// answers; the client checks every byte of the answer against what the seed makes.
//
// The call is a method of the CRI runtime service that podgate does not know (Method), so that
// podgate passes it through as it does every call it does not intercept.
package stresscall
