package client

// Waiting is how many ids the client's waits have registered (tests).
func Waiting(c *Client) int {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting)
}
