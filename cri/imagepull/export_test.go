package imagepull

// SetTrace lets the tests of package imagepull_test follow the governor's queue events.
func SetTrace(g *Governor, f func(event, image string)) { g.trace = f }
