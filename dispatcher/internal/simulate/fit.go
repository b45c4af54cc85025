package simulate

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mlsched/mlsched/shared/protocol"
)

// Fitting a scenario from a request log: an operator exports last week's
// requests and asks what each policy would have done with them. Fit reads
// the log (one row per request to a model, columns mapped by FitColumns,
// any of them absent) and writes a scenario of the same models and traffic:
//
//   - each model's failure probability: its model errors over the requests
//     that ran to an answer (a timeout is the latency's, so it is left out
//     of both), with a 95% Wilson interval; its timeout share is shown;
//   - its latency: a lognormal fitted to its successful latencies by the
//     mean and deviation of their logs, shown with its Kolmogorov-Smirnov
//     distance; where the log has sizes, latency = fixed + per unit x size
//     by least squares first, the lognormal fitted to the fixed part;
//   - its arrivals: the log's own timestamps, types, tenants and sizes,
//     replayed from a trace file written beside the scenario (trace.go);
//   - the nodes: the log's with the capacity the caller states, or as many
//     as the caller states, each hosting every model.
//
// What it cannot see it does not invent: no events, no drift (each model
// is one stationary step), no node slowdowns.

// FitColumns names the log's columns. An empty name means the column is
// absent. DefaultFitColumns are the names WriteLog writes.
type FitColumns struct {
	Time, Type, Tenant, Model, Node, Attempt, Status, Latency, Size string
}

// DefaultFitColumns are LogColumns' names.
var DefaultFitColumns = FitColumns{Time: "time", Type: "type", Tenant: "tenant", Model: "model", Node: "node",
	Attempt: "attempt", Status: "status", Latency: "latency_ms", Size: "size"}

// FitOptions configures Fit. Zero fields take the defaults shown.
type FitOptions struct {
	// Columns of the log (default DefaultFitColumns). A default name the
	// log does not have counts as absent; a name set in Explicit must exist.
	Columns FitColumns
	// Explicit lists the columns the caller named (by FitColumns field
	// name, e.g. "Latency"): those must be in the log.
	Explicit []string
	// LatencyUnit is the latency column's unit (default time.Millisecond).
	LatencyUnit time.Duration
	// Name of the scenario (default "fitted").
	Name string
	// TraceFile is the name the scenario gives its trace, relative to the
	// scenario file (default Name + ".trace.csv").
	TraceFile string
	// Nodes: that many nodes, each hosting every model (default 0: the
	// log's node column's, or else 4).
	Nodes int
	// Slots is each node's capacity (default 16).
	Slots int
	// Timeout of the scenario (default: the median latency of the log's
	// timeouts, or else 5s, at least twice the slowest success).
	Timeout time.Duration
	// TimeScale and RateMultiplier go into the arrival (trace.go; default
	// 1): replay the log faster, or with more or fewer requests.
	TimeScale, RateMultiplier float64
	// Rate of the Poisson arrivals when the log has no time column
	// (default 10/s).
	Rate float64
}

// ModelFit is what Fit found for one model.
type ModelFit struct {
	Model string `json:"model"`
	// Requests that ran to an answer: successes, model errors, timeouts.
	Successes, Failures, Timeouts int
	// FailureProb = Failures / (Successes + Failures), with its 95% Wilson
	// interval.
	FailureProb, FailureLow, FailureHigh float64
	// TimeoutProb = Timeouts / all three.
	TimeoutProb float64
	// Median and Sigma of the lognormal part of the latency.
	Median time.Duration
	Sigma  float64
	// PerUnit is the latency per unit of size (0: none fitted).
	PerUnit time.Duration
	// KS is the Kolmogorov-Smirnov distance between the fitted lognormal
	// and the latencies (less their size part); KSCritical its 5% critical
	// value for this many samples (1.36/√n).
	KS, KSCritical float64
}

// FitResult is a fitted scenario.
type FitResult struct {
	// Scenario is the scenario's JSON text.
	Scenario []byte
	// Trace is the CSV text of the arrivals (nil when the log has no time
	// column: the scenario's arrivals are then Poisson).
	Trace []byte
	// TraceFile is the name the scenario gives the trace.
	TraceFile string
	Models    []ModelFit
	// Rows read, and arrivals written (first attempts).
	Rows, Arrivals int
	// Notes say what was assumed for what the log lacks.
	Notes []string
	// Flows describe the arrivals per type and tenant (with a time column).
	Flows []ArrivalFit
}

// ArrivalFit describes one type's (and tenant's) arrivals in the log: how
// bursty they are is what a Poisson rate would hide.
type ArrivalFit struct {
	Type, Tenant string
	Count        int
	// MeanRate is arrivals per second over the log's span; PeakRate the
	// most in one second.
	MeanRate, PeakRate float64
	// CV is the coefficient of variation of the inter-arrival times (1 for
	// Poisson arrivals).
	CV float64
}

// ErrFit is wrapped by every error about the log's content.
var ErrFit = errors.New("cannot fit the log")

type fitRow struct {
	t            float64
	typ, tenant  string
	model, node  string
	attempt      int
	status       string // success, failure, timeout or "" (not the model's)
	lat          float64
	size         float64
	latOK, first bool
}

// classify maps a log's status to what the fit counts: "" for outcomes
// that say nothing about the model (its node's queue or crash, a cancel).
func classify(s string) string {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "success", "succeeded", "ok", "200", "done", "completed":
		return "success"
	case "timeout", "timed_out", "deadline_exceeded", "504":
		return "timeout"
	case "expired", "lost", "cancelled", "canceled", "superseded", "shed", string(protocol.OutcomeTaskError):
		return ""
	}
	return "failure"
}

// Fit reads a request log and fits a scenario to it.
func Fit(r io.Reader, opt FitOptions) (*FitResult, error) {
	if opt.Columns == (FitColumns{}) {
		opt.Columns = DefaultFitColumns
	}
	if opt.LatencyUnit <= 0 {
		opt.LatencyUnit = time.Millisecond
	}
	if opt.Name == "" {
		opt.Name = "fitted"
	}
	if opt.TraceFile == "" {
		opt.TraceFile = opt.Name + ".trace.csv"
	}
	if opt.Slots == 0 {
		opt.Slots = 16
	}
	if opt.Nodes < 0 || opt.Nodes > maxNodes || opt.Slots < 1 || opt.Slots > maxCapacity {
		return nil, fmt.Errorf("%w: %d nodes of %d slots: want 1..%d nodes of 1..%d slots", ErrFit, opt.Nodes, opt.Slots, maxNodes, maxCapacity)
	}
	if opt.Rate == 0 {
		opt.Rate = 10
	}
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: no header row: %v", ErrFit, err)
	}
	idx := map[string]int{}
	for i, h := range head {
		idx[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	res := &FitResult{TraceFile: opt.TraceFile}
	col := func(field, name string) (int, error) {
		if name == "" {
			return -1, nil
		}
		if i, ok := idx[name]; ok {
			return i, nil
		}
		if slices.Contains(opt.Explicit, field) {
			return -1, fmt.Errorf("%w: no column %q for the %s (columns: %s)", ErrFit, name, strings.ToLower(field), strings.Join(head, ", "))
		}
		return -1, nil
	}
	c := opt.Columns
	var ci [9]int
	for i, f := range []struct{ field, name string }{{"Time", c.Time}, {"Type", c.Type}, {"Tenant", c.Tenant}, {"Model", c.Model},
		{"Node", c.Node}, {"Attempt", c.Attempt}, {"Status", c.Status}, {"Latency", c.Latency}, {"Size", c.Size}} {
		if ci[i], err = col(f.field, f.name); err != nil {
			return nil, err
		}
	}
	ti, yi, ni, mi, di, ai, si, li, zi := ci[0], ci[1], ci[2], ci[3], ci[4], ci[5], ci[6], ci[7], ci[8]
	var rows []fitRow
	var origin time.Time
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFit, err)
		}
		if len(rows) >= MaxTasks {
			return nil, fmt.Errorf("%w: more than %d rows", ErrFit, MaxTasks)
		}
		get := func(i int) string {
			if i < 0 || i >= len(rec) {
				return ""
			}
			return strings.TrimSpace(rec[i])
		}
		rw := fitRow{typ: get(yi), tenant: get(ni), model: get(mi), node: get(di), status: "success", attempt: 1}
		if rw.typ == "" {
			rw.typ = "task"
		}
		if rw.model == "" {
			rw.model = "model"
		}
		for _, n := range []struct{ what, v string }{{"type", rw.typ}, {"model", rw.model}} {
			if err := validName(n.what, n.v); err != nil {
				return nil, fmt.Errorf("%w: row %d: %s %q cannot be a name (no dots, spaces, * or >)", ErrFit, line, n.what, n.v)
			}
		}
		if rw.node != "" {
			if err := validName("node", rw.node); err != nil {
				return nil, fmt.Errorf("%w: row %d: node %q cannot be a name (no dots, spaces, * or >)", ErrFit, line, rw.node)
			}
		}
		if rw.tenant != "" {
			if err := protocol.ValidToken(rw.tenant, protocol.MaxTenantLen); err != nil {
				return nil, fmt.Errorf("%w: row %d: tenant %q: %v", ErrFit, line, rw.tenant, err)
			}
		}
		if si >= 0 {
			rw.status = classify(get(si))
		}
		if ai >= 0 {
			if v := get(ai); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return nil, fmt.Errorf("%w: row %d: attempt %q is not a number >= 1", ErrFit, line, v)
				}
				rw.attempt = n
			}
		}
		rw.first = rw.attempt == 1
		if ti >= 0 {
			if rw.t, err = traceSeconds(get(ti), &origin); err != nil {
				return nil, fmt.Errorf("%w: row %d: %v", ErrFit, line, err)
			}
		}
		if li >= 0 {
			if v := get(li); v != "" {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || math.IsNaN(x) || x < 0 || x*float64(opt.LatencyUnit) > float64(MaxDuration) {
					return nil, fmt.Errorf("%w: row %d: latency %q is not a number >= 0", ErrFit, line, v)
				}
				// a latency below the simulator's least (0 in a log of
				// rounded milliseconds) is that least: its log is finite
				rw.lat, rw.latOK = max(x*float64(opt.LatencyUnit), float64(minLatency)), true
			}
		}
		if zi >= 0 {
			if v := get(zi); v != "" {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || math.IsNaN(x) || x < 0 || x > 1e12 {
					return nil, fmt.Errorf("%w: row %d: size %q is not a number in 0..1e12", ErrFit, line, v)
				}
				rw.size = x
			}
		}
		rows = append(rows, rw)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no rows", ErrFit)
	}
	res.Rows = len(rows)
	for _, n := range []struct {
		i    int
		note string
	}{{ti, "no time column: Poisson arrivals at %g/s"}, {li, "no latency column: every model's latency is assumed 100ms"},
		{si, "no status column: every request counted a success"}, {mi, "no model column: one model, \"model\""}} {
		if n.i < 0 {
			note := n.note
			if strings.Contains(note, "%g") {
				note = fmt.Sprintf(note, opt.Rate)
			}
			res.Notes = append(res.Notes, note)
		}
	}

	// Models: counts and latencies.
	type acc struct {
		fit   ModelFit
		lat   []float64
		size  []float64
		types map[string]bool
		nodes map[string]bool
		// the timeouts' latencies (0: not in the log, the timeout) and
		// sizes: latencies known only to exceed these
		cens, censSize []float64
	}
	slow := map[string]float64{}
	if di >= 0 && opt.Nodes == 0 {
		slow = nodeSlowdowns(rows)
		for _, n := range sortedKeys(slow) {
			res.Notes = append(res.Notes, fmt.Sprintf("node %s runs the models %.2fx slower than the fastest node: slowdown %.2f, its latencies divided by it", n, slow[n], slow[n]))
		}
	}
	models := map[string]*acc{}
	var names []string
	maxAttempt := 1
	var slowest float64
	var toLat []float64
	for i := range rows {
		rw := &rows[i]
		a := models[rw.model]
		if a == nil {
			a = &acc{fit: ModelFit{Model: rw.model}, types: map[string]bool{}, nodes: map[string]bool{}}
			models[rw.model] = a
			names = append(names, rw.model)
		}
		a.types[rw.typ] = true
		if rw.node != "" {
			a.nodes[rw.node] = true
		}
		maxAttempt = max(maxAttempt, rw.attempt)
		if f := slow[rw.node]; f > 0 && rw.latOK {
			rw.lat /= f
		}
		switch rw.status {
		case "success":
			a.fit.Successes++
			if rw.latOK {
				a.lat = append(a.lat, rw.lat)
				a.size = append(a.size, rw.size)
				slowest = max(slowest, rw.lat)
			}
		case "failure":
			a.fit.Failures++
		case "timeout":
			a.fit.Timeouts++
			if rw.latOK {
				toLat = append(toLat, rw.lat)
				a.cens = append(a.cens, rw.lat)
			} else {
				a.cens = append(a.cens, 0)
			}
			a.censSize = append(a.censSize, rw.size)
		}
	}
	sort.Strings(names)
	timeout := opt.Timeout
	if timeout <= 0 {
		if len(toLat) > 0 {
			timeout = time.Duration(median(toLat)).Round(time.Millisecond)
		} else {
			timeout = max(5*time.Second, time.Duration(2*slowest).Round(time.Second))
			res.Notes = append(res.Notes, fmt.Sprintf("no timeouts in the log: timeout %v assumed", timeout))
		}
	}
	if timeout <= 0 || timeout > MaxDuration {
		return nil, fmt.Errorf("%w: timeout %v is outside 1ms..%v", ErrFit, timeout, MaxDuration)
	}
	sc := Scenario{Name: opt.Name, Timeout: Duration(timeout), MaxAttempts: min(maxAttempt, 10)}
	if maxAttempt == 1 {
		sc.MaxAttempts = 0 // the default
	}
	for _, name := range names {
		a := models[name]
		f := &a.fit
		ran := f.Successes + f.Failures
		if ran > 0 {
			f.FailureProb = float64(f.Failures) / float64(ran)
			f.FailureLow, f.FailureHigh = wilson(f.Failures, ran)
		}
		if all := ran + f.Timeouts; all > 0 {
			f.TimeoutProb = float64(f.Timeouts) / float64(all)
		}
		dist := Dist{Dist: DistLognormal, Median: Duration(100 * time.Millisecond)}
		if len(a.lat) > 0 {
			fixed := a.lat
			if per := perUnit(a.lat, a.size); per > 0 {
				f.PerUnit = time.Duration(per)
				fixed = make([]float64, len(a.lat))
				for i := range a.lat {
					fixed[i] = max(a.lat[i]-per*a.size[i], float64(minLatency))
				}
			}
			// The timeouts are latencies known only to exceed their
			// censoring point (less their size part): fitting the
			// successes alone would fit a distribution cut at the
			// timeout, its median too low.
			var cens []float64
			for i, c := range a.cens {
				if c <= 0 {
					c = float64(timeout)
				}
				cens = append(cens, max(c-float64(f.PerUnit)*a.censSize[i], float64(minLatency)))
			}
			mu, sigma := lognormalFit(fixed)
			if len(cens) > 0 {
				mu, sigma = censoredLognormalFit(fixed, cens, mu, sigma)
			}
			if math.IsNaN(mu) || math.IsNaN(sigma) || math.IsInf(mu, 0) || math.IsInf(sigma, 0) {
				return nil, fmt.Errorf("%w: model %s: the latencies give no finite lognormal", ErrFit, name)
			}
			f.Median, f.Sigma = time.Duration(math.Exp(mu)).Round(time.Microsecond), min(sigma, 20)
			f.KS = ksLognormal(fixed, mu, sigma, cens)
			f.KSCritical = 1.36 / math.Sqrt(float64(len(fixed)))
			dist = Dist{Dist: DistLognormal, Median: Duration(max(f.Median, time.Microsecond)), Sigma: math.Round(f.Sigma*1e4) / 1e4}
		}
		p := math.Round(f.FailureProb*1e6) / 1e6
		m := Model{Name: name, Types: sortedKeys(a.types), Profile: []Step{{FailureProb: &p, Latency: &dist}}}
		if f.PerUnit > 0 {
			d := Duration(f.PerUnit)
			m.Profile[0].LatencyPerUnit = &d
		}
		sc.Models = append(sc.Models, m)
		res.Models = append(res.Models, *f)
	}
	// Nodes.
	switch {
	case opt.Nodes > 0:
		for i := range opt.Nodes {
			sc.Nodes = append(sc.Nodes, Node{Name: fmt.Sprintf("node-%d", i+1), Capacity: opt.Slots, Models: names})
		}
	case di >= 0:
		hosts := map[string][]string{}
		for _, name := range names {
			for n := range models[name].nodes {
				hosts[n] = append(hosts[n], name)
			}
		}
		for _, n := range sortedKeys(hostsSet(hosts)) {
			sc.Nodes = append(sc.Nodes, Node{Name: n, Capacity: opt.Slots, Models: hosts[n], Slowdown: math.Round(slow[n]*100) / 100})
		}
		for _, name := range names {
			if len(models[name].nodes) == 0 { // rows without a node: hosted everywhere
				for i := range sc.Nodes {
					sc.Nodes[i].Models = append(sc.Nodes[i].Models, name)
				}
			}
		}
	}
	if len(sc.Nodes) == 0 {
		for i := range 4 {
			sc.Nodes = append(sc.Nodes, Node{Name: fmt.Sprintf("node-%d", i+1), Capacity: opt.Slots, Models: names})
		}
		res.Notes = append(res.Notes, fmt.Sprintf("no node column and no -nodes: 4 nodes of %d slots assumed", opt.Slots))
	}
	// Arrivals: each request's first attempt.
	types := map[string]float64{}
	tenants := map[string]float64{}
	var first []*fitRow
	for i := range rows {
		if rows[i].first {
			first = append(first, &rows[i])
			types[rows[i].typ]++
			if rows[i].tenant != "" {
				tenants[rows[i].tenant]++
			}
		}
	}
	if len(first) == 0 {
		return nil, fmt.Errorf("%w: no first attempts (attempt 1) to take arrivals from", ErrFit)
	}
	res.Arrivals = len(first)
	sc.Arrival.Types = types
	if len(tenants) > 1 { // one tenant is no flow control: the run stays a plain one
		for _, t := range sortedKeys(tenants) {
			sc.Arrival.Flows = append(sc.Arrival.Flows, Flow{Tenant: t, Share: tenants[t]})
		}
	}
	if ti < 0 {
		sc.Arrival.Rate = opt.Rate
		sc.Tasks = len(first)
	} else {
		sort.SliceStable(first, func(i, j int) bool { return first[i].t < first[j].t })
		res.Flows = describeArrivals(first)
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		head := []string{"time", "type"}
		if zi >= 0 {
			head = append(head, "size")
		}
		if len(sc.Arrival.Flows) > 0 {
			head = append(head, "tenant")
		}
		_ = w.Write(head)
		t0 := first[0].t
		for _, r := range first {
			rec := []string{strconv.FormatFloat(r.t-t0, 'f', 6, 64), r.typ}
			if zi >= 0 {
				rec = append(rec, strconv.FormatFloat(r.size, 'g', -1, 64))
			}
			if len(sc.Arrival.Flows) > 0 {
				tn := r.tenant
				if tn == "" {
					tn = sc.Arrival.Flows[0].Tenant
				}
				rec = append(rec, tn)
			}
			_ = w.Write(rec)
		}
		w.Flush()
		res.Trace = b.Bytes()
		a := &sc.Arrival
		a.Trace, a.TimeColumn, a.TypeColumn = opt.TraceFile, "time", "type"
		if zi >= 0 {
			a.SizeColumn = "size"
		}
		if len(sc.Arrival.Flows) > 0 {
			a.TenantColumn = "tenant"
		}
		if opt.TimeScale != 1 {
			a.TimeScale = opt.TimeScale
		}
		if opt.RateMultiplier != 1 {
			a.RateMultiplier = opt.RateMultiplier
		}
	}
	sc.Description = fmt.Sprintf("fitted from a log of %d requests (%d arrivals) by mlsched simulate -fit", res.Rows, res.Arrivals)
	b, err := json.MarshalIndent(&sc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the scenario: %w", err)
	}
	res.Scenario = append(b, '\n')
	// The scenario must load as written: check it with its trace.
	if _, err := parseScenario(res.Scenario, func(name string) ([]byte, error) {
		if name == opt.TraceFile && res.Trace != nil {
			return res.Trace, nil
		}
		return nil, fmt.Errorf("no trace %q", name)
	}); err != nil {
		return nil, fmt.Errorf("%w: the fitted scenario does not load: %v", ErrFit, err)
	}
	return res, nil
}

// nodeSlowdowns finds the nodes that run every model slower: a node's
// factor is the median, over the models with at least 20 successes on it,
// of the model's median latency there over its median everywhere, and its
// slowdown that factor over the fastest node's. Only slowdowns of 1.15 or
// more are kept (below, the spread of the medians), so that a log of equal
// nodes gives equal nodes.
func nodeSlowdowns(rows []fitRow) map[string]float64 {
	type key struct{ model, node string }
	pair := map[key][]float64{}
	all := map[string][]float64{}
	for i := range rows {
		rw := &rows[i]
		if rw.status == "success" && rw.latOK && rw.node != "" {
			pair[key{rw.model, rw.node}] = append(pair[key{rw.model, rw.node}], rw.lat)
			all[rw.model] = append(all[rw.model], rw.lat)
		}
	}
	meds := map[string]float64{}
	for m, xs := range all {
		meds[m] = median(xs)
	}
	ratios := map[string][]float64{}
	for k, xs := range pair {
		if len(xs) >= 20 && meds[k.model] > 0 {
			ratios[k.node] = append(ratios[k.node], median(xs)/meds[k.model])
		}
	}
	factor := map[string]float64{}
	fastest := math.Inf(1)
	for n, rs := range ratios {
		factor[n] = median(rs)
		fastest = min(fastest, factor[n])
	}
	out := map[string]float64{}
	for n, f := range factor {
		if s := f / fastest; s >= 1.15 && fastest > 0 {
			out[n] = s
		}
	}
	return out
}

// describeArrivals summarises the arrivals (in time order) per type and
// tenant.
func describeArrivals(first []*fitRow) []ArrivalFit {
	type key struct{ typ, tenant string }
	groups := map[key][]float64{}
	var keys []key
	for _, r := range first {
		k := key{r.typ, r.tenant}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r.t)
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.typ+"\x00"+a.tenant, b.typ+"\x00"+b.tenant) })
	span := max(first[len(first)-1].t-first[0].t, 1)
	var out []ArrivalFit
	for _, k := range keys {
		ts := groups[k]
		f := ArrivalFit{Type: k.typ, Tenant: k.tenant, Count: len(ts), MeanRate: float64(len(ts)) / span}
		for i, j := 0, 0; i < len(ts); i++ { // the most in a second from an arrival on
			for j < len(ts) && ts[j] < ts[i]+1 {
				j++
			}
			f.PeakRate = max(f.PeakRate, float64(j-i))
		}
		if len(ts) > 2 {
			var m, v float64
			for i := 1; i < len(ts); i++ {
				m += ts[i] - ts[i-1]
			}
			m /= float64(len(ts) - 1)
			for i := 1; i < len(ts); i++ {
				d := ts[i] - ts[i-1] - m
				v += d * d
			}
			if m > 0 {
				f.CV = math.Sqrt(v/float64(len(ts)-1)) / m
			}
		}
		out = append(out, f)
	}
	return out
}

func hostsSet(m map[string][]string) map[string]bool {
	s := map[string]bool{}
	for k := range m {
		s[k] = true
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// traceSeconds reads a time: a number of seconds, or a timestamp in
// seconds after origin (the first timestamp read, which it sets).
func traceSeconds(s string, origin *time.Time) (float64, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > MaxDuration.Seconds()*1e3 {
			return 0, fmt.Errorf("time %q is out of range", s)
		}
		return v, nil
	}
	for _, l := range traceTimeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			if origin.IsZero() {
				*origin = t
			}
			return t.Sub(*origin).Seconds(), nil
		}
	}
	return 0, fmt.Errorf("time %q is neither seconds nor a timestamp such as 2023-11-16 18:17:03.98", s)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// wilson is the 95% Wilson score interval of k successes in n trials.
func wilson(k, n int) (lo, hi float64) {
	const z = 1.959964
	p, nf := float64(k)/float64(n), float64(n)
	den := 1 + z*z/nf
	mid := (p + z*z/(2*nf)) / den
	half := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)) / den
	return max(0, mid-half), min(1, mid+half)
}

// perUnit is the least-squares slope of latency over size (ns per unit),
// or 0 when the sizes do not vary or the slope is not positive.
func perUnit(lat, size []float64) float64 {
	n := float64(len(lat))
	var mx, my float64
	for i := range lat {
		mx += size[i]
		my += lat[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx float64
	for i := range lat {
		sxy += (size[i] - mx) * (lat[i] - my)
		sxx += (size[i] - mx) * (size[i] - mx)
	}
	if sxx <= 0 || sxy <= 0 {
		return 0
	}
	return sxy / sxx
}

// lognormalFit is the maximum-likelihood lognormal: the mean and standard
// deviation of the logs.
func lognormalFit(xs []float64) (mu, sigma float64) {
	for _, x := range xs {
		mu += math.Log(x)
	}
	mu /= float64(len(xs))
	for _, x := range xs {
		d := math.Log(x) - mu
		sigma += d * d
	}
	return mu, math.Sqrt(sigma / float64(len(xs)))
}

// censoredLognormalFit is the maximum-likelihood lognormal of the
// observed xs and of values known only to exceed each of cens, by
// expectation-maximisation on the logs from (mu, sigma).
func censoredLognormalFit(xs, cens []float64, mu, sigma float64) (float64, float64) {
	var sy, syy float64
	for _, x := range xs {
		y := math.Log(x)
		sy += y
		syy += y * y
	}
	n := float64(len(xs) + len(cens))
	for range 500 {
		if sigma <= 0 {
			sigma = 1e-6
		}
		ey, eyy := sy, syy
		for _, c := range cens {
			a := (math.Log(c) - mu) / sigma
			tail := 0.5 * math.Erfc(a/math.Sqrt2)
			lambda := a // the limit of the inverse Mills ratio far in the tail
			if tail > 1e-300 {
				lambda = math.Exp(-a*a/2) / math.Sqrt(2*math.Pi) / tail
			}
			ey += mu + sigma*lambda
			eyy += sigma*sigma*(1+a*lambda) + 2*mu*sigma*lambda + mu*mu
		}
		nmu := ey / n
		nsigma := math.Sqrt(max(eyy/n-nmu*nmu, 0))
		done := math.Abs(nmu-mu) < 1e-9 && math.Abs(nsigma-sigma) < 1e-9
		mu, sigma = nmu, nsigma
		if done {
			break
		}
	}
	return mu, sigma
}

// ksLognormal is the Kolmogorov-Smirnov distance between the sample and
// the lognormal(mu, sigma), cut at the median of cens when there are
// censored values (the sample is then what fell below them).
func ksLognormal(xs []float64, mu, sigma float64, cens []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := float64(len(s))
	cdf := func(x float64) float64 {
		switch {
		case sigma > 0:
			return 0.5 * math.Erfc(-(math.Log(x)-mu)/(sigma*math.Sqrt2))
		case math.Log(x) >= mu:
			return 1
		}
		return 0
	}
	cut := 1.0
	if len(cens) > 0 {
		cut = max(cdf(median(cens)), 1e-12)
	}
	var d float64
	for i, x := range s {
		f := min(cdf(x)/cut, 1)
		d = max(d, math.Abs(f-float64(i)/n), math.Abs(float64(i+1)/n-f))
	}
	return d
}

// WriteFitTable writes what Fit found, one model a line.
func (r *FitResult) WriteFitTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "fitted %d requests (%d arrivals)\n", r.Rows, r.Arrivals)
	fmt.Fprintf(&b, "%-16s %8s %8s %8s %22s %9s %10s %7s %10s %7s %7s\n", "model", "ok", "failed", "timeout",
		"failure p [95% CI]", "timeout p", "median", "sigma", "per unit", "KS D", "KS 5%")
	for _, m := range r.Models {
		per := "-"
		if m.PerUnit > 0 {
			per = m.PerUnit.String()
		}
		fmt.Fprintf(&b, "%-16s %8d %8d %8d %7.4f [%.4f,%.4f] %9.4f %10v %7.3f %10s %7.4f %7.4f\n", m.Model, m.Successes, m.Failures, m.Timeouts,
			m.FailureProb, m.FailureLow, m.FailureHigh, m.TimeoutProb, m.Median.Round(time.Microsecond), m.Sigma, per, m.KS, m.KSCritical)
	}
	if len(r.Flows) > 0 {
		fmt.Fprintf(&b, "%-16s %-16s %8s %9s %9s %7s\n", "type", "tenant", "arrivals", "mean/s", "peak/s", "CV")
		for _, f := range r.Flows {
			fmt.Fprintf(&b, "%-16s %-16s %8d %9.3f %9.0f %7.2f\n", f.Type, f.Tenant, f.Count, f.MeanRate, f.PeakRate, f.CV)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
