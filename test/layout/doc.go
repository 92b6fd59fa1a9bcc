// Package layout holds the house to its rules: the project card's top level, the kernel at the
// ground, features that import no other feature and nothing of the composition root's, and
// nothing outside agent/ and cmd/ importing agent/... (docs/architecture.md draws it). It has
// tests only.
package layout
