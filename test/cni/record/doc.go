// Package record is the library of the CNI recorder plugin (test/cni/recorder): its network
// configuration, the JSON-lines record it appends to, and the helpers end-to-end tests use to
// read that record.
//
// Each ADD (and DEL) the recorder handles becomes one [Entry]: when it ran, the container and
// network namespace CNI was given, the pod (from CNI_ARGS K8S_POD_NAMESPACE, K8S_POD_NAME,
// K8S_POD_UID) and, for each watched host interface, whether it existed in the plugin's network
// namespace — the host's, where containerd runs CNI plugins — at that moment, and which host
// files matching its watched glob patterns existed (a DRA driver's CDI spec files). The DRA end-to-end
// test reads the entry of its pod to see whether podgate had prepared the pod's DRA network
// device (e.g. interface pgnic0 of test/dradriver) before containerd ran CNI ADD.
package record
