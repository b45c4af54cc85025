package worker

// The node's admission: a received dispatch waits for its model's own limit
// (max_concurrency) and then for one of the node's slots, which go to the
// waiting dispatches in priority and tenant order (slots.go). The model's
// limit comes first, so that a task waiting for it does not hold one of
// the node's slots. onMessage (task.go) queues each dispatch as it is
// delivered, its goroutine enters before it runs and leaves once it has
// reported.

// queue takes the dispatch's place in the node's order, in delivery order,
// and counts it as waiting.
func (w *Worker) queue(d dispatch) slotTicket {
	t := w.slots.ticket(d.priority, d.tenant)
	w.waiting.Add(1)
	return t
}

// enter blocks until the dispatch may run: a token of its model's limit,
// if it has one, then a node slot at its place in the order. m is nil for
// a model this node does not host (the dispatch is reported as such, from
// a slot all the same).
func (w *Worker) enter(m *hosted, t slotTicket) {
	if m != nil {
		m.inFlight.Add(1) // waiting or running, as announced
		if m.limit != nil {
			m.limit <- struct{}{}
		}
	}
	w.slots.wait(t)
	w.waiting.Add(-1)
	w.inFlight.Add(1)
}

// leave gives back what enter took, the node's slot first.
func (w *Worker) leave(m *hosted) {
	w.inFlight.Add(-1)
	w.slots.release()
	if m != nil {
		if m.limit != nil {
			<-m.limit
		}
		m.inFlight.Add(-1)
	}
}
