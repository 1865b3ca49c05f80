//go:build race

package chain

// Under -race, service B is built with the race detector too.
func init() { buildFlags = append(buildFlags, "-race") }
