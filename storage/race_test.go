//go:build race

package storage

// raceEnabled: the race detector's shadow memory makes memory
// measurements meaningless.
const raceEnabled = true
