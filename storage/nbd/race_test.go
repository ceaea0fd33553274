//go:build race

package nbd

// raceEnabled: the race detector's shadow memory makes memory
// measurements meaningless.
const raceEnabled = true
