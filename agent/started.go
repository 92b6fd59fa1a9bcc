package agent

// Rebuilt is closed once the pod registry has been rebuilt from the runtime at start-up: the
// last of podgate's start-up work. It stays open when the rebuild never succeeds.
func (a *Agent) Rebuilt() <-chan struct{} { return a.rebuilt }
