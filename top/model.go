package top

import (
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// Model is the interactive view (a bubbletea model): it loads a snapshot
// every Interval and redraws; keys select and sort.
type Model struct {
	// Load reads a snapshot (the agent's statistics, the gateways').
	Load func() Snapshot
	// Interval is the refresh period (0: 1 s).
	Interval time.Duration

	snap Snapshot
	view View
}

type tick struct{}

// NewModel returns a view sorted by col, refreshed every interval.
func NewModel(load func() Snapshot, interval time.Duration, col Column) *Model {
	if interval <= 0 {
		interval = time.Second
	}
	return &Model{Load: load, Interval: interval, snap: load(), view: View{Sort: col}}
}

func (m *Model) next() tea.Cmd {
	return tea.Tick(m.Interval, func(time.Time) tea.Msg { return tick{} })
}

// Init implements tea.Model.
func (m *Model) Init() tea.Cmd { return m.next() }

// Update implements tea.Model.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tick:
		m.snap = m.Load()
		return m, m.next()
	case tea.WindowSizeMsg:
		m.view.Width, m.view.Height = msg.Width, msg.Height
	case tea.KeyMsg:
		k := msg.String()
		switch k {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "up", "k":
			m.view.Selected = max(0, m.view.Selected-1)
		case "down", "j":
			m.view.Selected = min(len(Rows(m.snap))-1, m.view.Selected+1)
		default:
			if c, ok := ColumnByKey[k]; ok {
				m.view.Sort = c
			}
		}
	}
	return m, nil
}

// View implements tea.Model.
func (m *Model) View() string { return Render(m.snap, m.view) }
