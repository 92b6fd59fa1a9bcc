package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
	kjson "sigs.k8s.io/json"
)

// decodeStrict decodes one YAML document into v: the YAML becomes JSON, which is decoded
// case-sensitively with unknown and duplicate fields refused, and every error is traced back to
// the path and line of its YAML node.
func decodeStrict(data []byte, v any) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	w := &jsonWriter{byPath: map[string]*yaml.Node{}}
	if root.Kind == 0 || root.Kind == yaml.DocumentNode { // empty document
		w.buf.WriteString("null")
	} else if err := w.write(root, "", 0); err != nil {
		return err
	}
	if len(w.errs) > 0 {
		return errors.Join(w.errs...)
	}
	strict, err := kjson.UnmarshalStrict(w.buf.Bytes(), v)
	if err != nil {
		if located := w.locateUnmarshalerError(root, reflect.TypeOf(v), ""); located != nil {
			return located
		}
		return w.explain(err, v)
	}
	var errs []error
	for _, e := range strict {
		errs = append(errs, w.explainStrict(e))
	}
	return errors.Join(errs...)
}

// jsonWriter turns a yaml.Node tree into JSON and remembers where each value came from.
type jsonWriter struct {
	buf    bytes.Buffer
	byPath map[string]*yaml.Node // field path (as sigs.k8s.io/json writes it) → key or item node
	spans  []jsonSpan
	errs   []error // duplicate keys
}

// jsonSpan is one value in the JSON: its bytes [start, end), its node and path.
type jsonSpan struct {
	start, end int
	node       *yaml.Node
	path       string
}

const maxYAMLDepth = 1000

func (w *jsonWriter) write(n *yaml.Node, path string, depth int) error {
	if depth > maxYAMLDepth {
		return fmt.Errorf("%s: nested too deeply (line %d)", displayPath(path), n.Line)
	}
	at := n
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
		depth++
		if depth > maxYAMLDepth {
			return fmt.Errorf("%s: aliases nested too deeply (line %d)", displayPath(path), at.Line)
		}
	}
	start := w.buf.Len()
	switch n.Kind {
	case yaml.MappingNode:
		w.buf.WriteByte('{')
		seen := map[string]*yaml.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			for k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			if k.Kind != yaml.ScalarNode {
				return fmt.Errorf("%s: a key must be a scalar (line %d)", displayPath(path), k.Line)
			}
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if first, dup := seen[k.Value]; dup {
				w.errs = append(w.errs, fmt.Errorf("%s: duplicate key %q (line %d, first at line %d)", p, k.Value, k.Line, first.Line))
				continue
			}
			seen[k.Value] = k
			w.byPath[p] = k
			if len(seen) > 1 {
				w.buf.WriteByte(',')
			}
			key, _ := json.Marshal(k.Value)
			w.buf.Write(key)
			w.buf.WriteByte(':')
			if err := w.write(val, p, depth+1); err != nil {
				return err
			}
		}
		w.buf.WriteByte('}')
	case yaml.SequenceNode:
		w.buf.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			p := fmt.Sprintf("%s[%d]", path, i)
			w.byPath[p] = item
			if err := w.write(item, p, depth+1); err != nil {
				return err
			}
		}
		w.buf.WriteByte(']')
	case yaml.ScalarNode:
		b, err := scalarJSON(n)
		if err != nil {
			return fmt.Errorf("%s: %w (line %d)", displayPath(path), err, at.Line)
		}
		w.buf.Write(b)
	default:
		return fmt.Errorf("%s: unexpected YAML node (line %d)", displayPath(path), at.Line)
	}
	w.spans = append(w.spans, jsonSpan{start: start, end: w.buf.Len(), node: at, path: path})
	return nil
}

// scalarJSON writes a YAML scalar as JSON: strings (and timestamps) stay strings, as they read.
func scalarJSON(n *yaml.Node) ([]byte, error) {
	switch n.ShortTag() {
	case "!!null":
		return []byte("null"), nil
	case "!!bool", "!!int", "!!float":
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, err
		}
		return json.Marshal(v)
	default:
		return json.Marshal(n.Value)
	}
}

func displayPath(path string) string {
	if path == "" {
		return "(document)"
	}
	return path
}

// line is the line of the node at path, or 0.
func (w *jsonWriter) line(path string) int {
	if n := w.byPath[path]; n != nil {
		return n.Line
	}
	return 0
}

func withLine(msg string, line int) error {
	if line == 0 {
		return errors.New(msg)
	}
	return fmt.Errorf("%s (line %d)", msg, line)
}

// explainStrict rewrites an unknown or duplicate field error of sigs.k8s.io/json.
func (w *jsonWriter) explainStrict(err error) error {
	var fe kjson.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	path := fe.FieldPath()
	key := path
	if i := strings.LastIndexAny(path, ".]"); i >= 0 && path[i] == '.' {
		key = path[i+1:]
	}
	kind, _, _ := strings.Cut(err.Error(), " \"") // "unknown field" or "duplicate field"
	return withLine(fmt.Sprintf("%s: %s %q", path, kind, key), w.line(path))
}

// explain rewrites a decoding error of the value v points to: a type error names the value's
// path and line.
func (w *jsonWriter) explain(err error, v any) error {
	if isSyntax, off := kjson.SyntaxErrorOffset(err); isSyntax {
		return fmt.Errorf("internal error: converting YAML to JSON at byte %d: %w", off, err)
	}
	// sigs.k8s.io/json keeps its type error unexported; the standard decoder it forks reports
	// the same error, at the same offset, as an exported *json.UnmarshalTypeError.
	var te *json.UnmarshalTypeError
	if t := reflect.TypeOf(v); t != nil && t.Kind() == reflect.Pointer {
		if errors.As(json.Unmarshal(w.buf.Bytes(), reflect.New(t.Elem()).Interface()), &te) {
			if sp, ok := w.spanAt(int(te.Offset)); ok {
				return withLine(fmt.Sprintf("%s: cannot decode %s into %s", displayPath(sp.path), te.Value, te.Type), sp.node.Line)
			}
		}
	}
	return err
}

var jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// locateUnmarshalerError finds the first value, in document order, that a json.Unmarshaler of
// the configuration (such as Duration) refuses, and names its path and line: the decoder returns
// such errors without saying where. It walks the YAML beside the Go type t; nil if none refuses.
func (w *jsonWriter) locateUnmarshalerError(n *yaml.Node, t reflect.Type, path string) error {
	at := n
	for depth := 0; n.Kind == yaml.AliasNode && n.Alias != nil && depth < maxYAMLDepth; depth++ {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer && !t.Implements(jsonUnmarshalerType) {
		t = t.Elem()
	}
	if t.Implements(jsonUnmarshalerType) || reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		for _, sp := range w.spans {
			if sp.node != at {
				continue
			}
			target := reflect.New(t)
			if t.Kind() == reflect.Pointer {
				target = reflect.New(t.Elem())
			}
			if err := json.Unmarshal(w.buf.Bytes()[sp.start:sp.end], target.Interface()); err != nil {
				return withLine(fmt.Sprintf("%s: %v", displayPath(path), err), at.Line)
			}
			return nil
		}
		return nil
	}
	child := func(p, key string) string {
		if p == "" {
			return key
		}
		return p + "." + key
	}
	switch {
	case n.Kind == yaml.MappingNode && (t.Kind() == reflect.Struct || t.Kind() == reflect.Map):
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			for depth := 0; k.Kind == yaml.AliasNode && k.Alias != nil && depth < maxYAMLDepth; depth++ {
				k = k.Alias
			}
			var ft reflect.Type
			if t.Kind() == reflect.Map {
				ft = t.Elem()
			} else if f, ok := jsonField(t, k.Value); ok {
				ft = f.Type
			} else {
				continue
			}
			if err := w.locateUnmarshalerError(val, ft, child(path, k.Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, item := range n.Content {
			if err := w.locateUnmarshalerError(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonField is the exported field of struct t whose JSON name is exactly name.
func jsonField(t reflect.Type, name string) (reflect.StructField, bool) {
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// spanAt is the innermost value whose bytes hold offset (a decoder's offset is just past what it read).
func (w *jsonWriter) spanAt(off int) (jsonSpan, bool) {
	best, found := jsonSpan{}, false
	for _, sp := range w.spans {
		if sp.start < off && off <= sp.end && (!found || sp.start >= best.start) {
			best, found = sp, true
		}
	}
	return best, found
}
