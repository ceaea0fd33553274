package sim

import (
	"encoding/json"
	"fmt"
	"os"
)

// LiveFigures are the live measurements of a scenario's kind: live
// expectations (scripts/reproduce-live.sh writes them to
// out/live/SCENARIO.json).
type LiveFigures struct {
	// Source says what measured them, where and when.
	Source string `json:"source"`
	// Figures by expectation name.
	Figures map[string]LiveFigure `json:"figures"`
}

// LiveFigure is one live measurement in the unit of its expectation
// ("ratio": 1.05 is +5%; "us": microseconds).
type LiveFigure struct {
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// LoadLiveFigures reads a live figures file.
func LoadLiveFigures(path string) (*LiveFigures, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lf LiveFigures
	if err := json.Unmarshal(data, &lf); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return &lf, nil
}
