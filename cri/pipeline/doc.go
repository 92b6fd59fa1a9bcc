// Package pipeline holds the shapes every feature of podgate plugs into, and nothing of any
// feature: the pod-sandbox pipeline's Stage (a step, its undo, and what it does on
// StopPodSandbox and RemovePodSandbox), the Sandbox a RunPodSandbox call carries through the
// stages, the Runner that runs them in order and undoes them in reverse, the runner's own
// stages (forward to the runtime, read the sandbox's status, record it), and the Hook of one
// feature in one other CRI method.
//
// A feature builds its stages and hooks in its own package; the composition root (agent)
// holds the one ordered stage list and the one hook table per method, and passes them here.
package pipeline
