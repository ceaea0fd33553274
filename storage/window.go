package storage

import (
	"sluice/parda"
	"sluice/policy"
)

// uncontrolledWindow is the window of a datastore without SIOC.
const uncontrolledWindow = 256

// pardaController is the window control of a datastore with SIOC s
// (policy.SIOC.Controller).
func pardaController(s policy.SIOC) *parda.Controller { return s.Controller() }

// initialWindow is the window a datastore under ctl starts with.
func initialWindow(ctl *parda.Controller) float64 { return ctl.InitialWindow() }

// The period's decision is package parda's (parda.Step), shared with the
// throttle driver; these names keep the gateway's code short.
type (
	statsRecord   = parda.Record
	periodInput   = parda.StepInput
	periodOutput  = parda.StepOutput
	datastoreView = parda.View
)

func pardaStep(ctl *parda.Controller, in periodInput) periodOutput { return parda.Step(ctl, in) }

func viewOf(recs []statsRecord, nowNs int64) datastoreView { return parda.ViewOf(recs, nowNs) }
