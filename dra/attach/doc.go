// Package attach moves the DRA network devices of the drivers named in dra.attach into their
// pod once CNI has run (the pipeline's "dra-attach" stage) and gives them back to the host
// when the sandbox stops. Each move is an obligation to give the device back, on disk before
// the move (an attach intent, Intents: this package's section of the pod registry's checkpoint);
// an intent an interrupted attach left is settled once the registry is rebuilt from the runtime.
package attach
