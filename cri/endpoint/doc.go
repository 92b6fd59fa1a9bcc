// Package endpoint parses CRI endpoints ("unix:///path" or "/path"). It is a leaf, so that the
// configuration checks the endpoints it names with the rule cri dials them by, without
// importing cri.
package endpoint
