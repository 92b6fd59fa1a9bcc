// Package podview is the composition root's adapter between the features' records and the
// PodResources service: each pod of the registry with what every feature keeps of it (the
// sysctl results, the DRA claims and the devices attached, the containers' resources, the
// pulls), rendered as podgate's extension shows it (Message), its changes as watch events
// (Event, Changes). It may import every feature; no feature imports it.
package podview
