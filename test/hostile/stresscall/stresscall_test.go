package stresscall

import (
	"bytes"
	"strings"
	"testing"
)

// TestDecodeChecksThePayload: a request decodes to its spec; a byte of its payload changed,
// or one missing, is found and its offset said.
func TestDecodeChecksThePayload(t *testing.T) {
	s := Spec{Seed: 42, Answer: 1000, Messages: 3, Header: 10, Trailer: 12000, Payload: 5000, Request: 7}
	b := s.Encode()
	got, err := Decode(b)
	if err != nil || got != s {
		t.Fatalf("Decode = %+v, %v; want %+v", got, err, s)
	}
	changed := bytes.Clone(b)
	changed[specSize+1234] ^= 1
	if _, err := Decode(changed); err == nil || !strings.Contains(err.Error(), "at byte 1234") {
		t.Errorf("a changed byte: %v", err)
	}
	if _, err := Decode(b[:len(b)-1]); err == nil || !strings.Contains(err.Error(), "at byte 4999") {
		t.Errorf("a missing byte: %v", err)
	}
	if _, err := Decode(b[:specSize-1]); err == nil {
		t.Error("a request shorter than a spec decoded")
	}
}

// TestPartsMakeTheAnswer: the messages, one after the other, are the answer; each seed and
// kind makes bytes of its own.
func TestPartsMakeTheAnswer(t *testing.T) {
	s := Spec{Seed: 7, Answer: 10001, Messages: 4}
	if got := bytes.Join(s.Parts(), nil); !bytes.Equal(got, s.AnswerBytes()) {
		t.Error("the parts joined are not the answer")
	}
	if bytes.Equal(Bytes(1, kindAnswer, 64), Bytes(2, kindAnswer, 64)) || bytes.Equal(Bytes(1, kindAnswer, 64), Bytes(1, kindPayload, 64)) {
		t.Error("two seeds or kinds make the same bytes")
	}
	if v := (Spec{Seed: 3, Trailer: 100}).TrailerValue(); len(v) != 100 || strings.Trim(v, "abcdefghijklmnopqrstuvwxyz") != "" {
		t.Errorf("trailer value %q: want 100 letters", v)
	}
	if Differs([]byte("abc"), []byte("abd")) != 2 || Differs([]byte("ab"), []byte("abc")) != 2 || Differs([]byte("x"), []byte("x")) != -1 {
		t.Error("Differs")
	}
}
