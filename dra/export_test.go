package dra

// SetTrace lets the tests of package dra_test follow the events on registry paths. Set it
// before Run.
func SetTrace(d *Drivers, f func(event, path string)) { d.trace = f }
