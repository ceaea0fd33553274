package mclock

// Tracker is the client side of dmClock: a client whose requests go to
// several servers (datastores, gateways) keeps one Tracker, reports every
// completion to it, and asks it for the Delta and Rho of each request it
// sends, so that every server's tags account for the service the client got
// elsewhere. Its reservation, shares and limit then hold for the sum of its
// service over all servers rather than per server.
//
// Delta is the cost the other servers completed for the client since its
// previous request to this server; Rho is the part of it they served in
// their reservation phase. Servers are numbered from 0. The zero Tracker is
// ready to use.
type Tracker struct {
	total, totalR uint64 // cost completed everywhere, and by reservation
	servers       []trackedServer
}

type trackedServer struct {
	own, ownR           uint64 // cost completed by this server
	lastTotal, lastTotR uint64 // totals at the previous request to it
	lastOwn, lastOwnR   uint64 // own counters then
}

func (t *Tracker) server(s int) *trackedServer {
	for len(t.servers) <= s {
		t.servers = append(t.servers, trackedServer{})
	}
	return &t.servers[s]
}

// Completed records that server completed a request of the given cost,
// served in phase (as the server's Pull reported it: LastPhase).
func (t *Tracker) Completed(server int, cost int64, phase Phase) {
	sv := t.server(server)
	c := uint64(max(cost, 0))
	t.total += c
	sv.own += c
	if phase == Reservation {
		t.totalR += c
		sv.ownR += c
	}
}

// Next returns the Delta and Rho for a request about to be sent to server,
// and starts counting anew for that server.
func (t *Tracker) Next(server int) (delta, rho uint32) {
	sv := t.server(server)
	d := (t.total - sv.lastTotal) - (sv.own - sv.lastOwn)
	r := (t.totalR - sv.lastTotR) - (sv.ownR - sv.lastOwnR)
	sv.lastTotal, sv.lastTotR, sv.lastOwn, sv.lastOwnR = t.total, t.totalR, sv.own, sv.ownR
	return uint32(min(d, 1<<32-1)), uint32(min(r, 1<<32-1))
}
