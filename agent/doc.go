// Package agent is podgate's composition root: the configuration file (types, strict loading,
// validation), the wiring of podgate's features into the CRI proxy, the metrics and health HTTP
// server, and start-up and graceful shutdown.
package agent
