package simulate

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Trace replay: a scenario's arrivals may come from a CSV file of real
// requests instead of a Poisson process, because real traffic is burstier
// than any rate a scenario states (the Azure code trace peaks at 67
// requests in one second against a mean of 2.6). The arrival's "trace"
// names the file; its other trace fields say which columns to read and how
// to scale them:
//
//	"arrival": {"trace": "code.csv", "time_column": "TIMESTAMP",
//	            "size_column": "ContextTokens", "time_scale": 0.5,
//	            "rate_multiplier": 2, "types": {"generate": 1}}
//
// Each row is one arrival at its own time (the first row's is 0). Times are
// timestamps ("2023-11-16 18:17:03.9799600", RFC 3339) or numbers of
// seconds; rows are replayed in time order.

// maxTraceBytes bounds a trace file (the Azure conversation trace is 720 KB).
const maxTraceBytes = 256 << 20

// traceTimeLayouts are the timestamp forms a time column may use.
var traceTimeLayouts = []string{"2006-01-02 15:04:05.999999999", time.RFC3339Nano, "2006-01-02T15:04:05.999999999"}

// traceData is a loaded trace: one arrival per entry, in time order, with
// the rate multiplier and time scale applied.
type traceData struct {
	at      []time.Duration
	size    []float64
	typ     []string // nil: types drawn by weight
	tenant  []string // nil: flows drawn by share
	span    time.Duration
	meanGap time.Duration
}

// opener reads a file a scenario names.
type opener func(name string) ([]byte, error)

// dirOpener resolves relative names against dir (a scenario file's
// directory; "" for the working directory).
func dirOpener(dir string) opener {
	return func(name string) ([]byte, error) {
		if !filepath.IsAbs(name) && dir != "" {
			name = filepath.Join(dir, name)
		}
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxTraceBytes+1))
		if err != nil {
			return nil, err
		}
		if len(b) > maxTraceBytes {
			return nil, fmt.Errorf("%s is larger than %d MiB", name, maxTraceBytes>>20)
		}
		return b, nil
	}
}

// builtinOpener reads the traces embedded beside the built-in scenarios.
func builtinOpener(name string) ([]byte, error) {
	return builtinFS.ReadFile(path.Clean(path.Join("scenarios", name)))
}

// validateTrace checks the trace fields of the arrival (a trace replaces the
// rate, its profile and the default task count) and loads the file.
func (sc *Scenario) validateTrace(open opener) error {
	a := &sc.Arrival
	if a.Trace == "" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"time_column", a.TimeColumn != ""}, {"size_column", a.SizeColumn != ""}, {"type_column", a.TypeColumn != ""},
			{"tenant_column", a.TenantColumn != ""}, {"time_scale", a.TimeScale != 0}, {"rate_multiplier", a.RateMultiplier != 0}} {
			if f.set {
				return invalid("arrival."+f.name, "applies only with arrival.trace")
			}
		}
		return nil
	}
	if a.Rate != 0 {
		return invalid("arrival.rate", "a trace's arrivals come at its own times: use rate_multiplier to scale them, not rate")
	}
	if len(a.Profile) > 0 {
		return invalid("arrival.profile", "a trace's arrivals come at its own times: no rate profile")
	}
	if a.TimeScale == 0 {
		a.TimeScale = 1
	}
	if math.IsNaN(a.TimeScale) || a.TimeScale < 1e-6 || a.TimeScale > 1e6 {
		return invalid("arrival.time_scale", "%g is outside 1e-6..1e6", a.TimeScale)
	}
	if a.RateMultiplier == 0 {
		a.RateMultiplier = 1
	}
	if math.IsNaN(a.RateMultiplier) || a.RateMultiplier < 1e-3 || a.RateMultiplier > 1000 {
		return invalid("arrival.rate_multiplier", "%g is outside 0.001..1000", a.RateMultiplier)
	}
	if a.TenantColumn != "" && len(a.Flows) == 0 {
		return invalid("arrival.tenant_column", "needs arrival.flows: each row's tenant picks the flow of that tenant")
	}
	b, err := open(a.Trace)
	if err != nil {
		return invalid("arrival.trace", "%v", err)
	}
	tr, err := parseTrace(b, a)
	if err != nil {
		var se *ScenarioError
		if errors.As(err, &se) {
			return err
		}
		return invalid("arrival.trace", "%s: %v", a.Trace, err)
	}
	for i, typ := range tr.typ {
		if _, ok := a.Types[typ]; !ok {
			return invalid("arrival.trace", "%s row %d: type %q is not in arrival.types", a.Trace, i+2, typ)
		}
	}
	for i, ten := range tr.tenant {
		if !slices.ContainsFunc(a.Flows, func(f Flow) bool { return f.Tenant == ten }) {
			return invalid("arrival.trace", "%s row %d: no flow of tenant %q", a.Trace, i+2, ten)
		}
	}
	if sc.Tasks == 0 {
		sc.Tasks = len(tr.at)
	}
	sc.trace = tr
	return nil
}

// parseTrace reads a trace's CSV text: a header row naming the columns,
// then one row per request.
func parseTrace(b []byte, a *Arrival) (*traceData, error) {
	r := csv.NewReader(bytes.NewReader(b))
	r.ReuseRecord = true
	r.FieldsPerRecord = -1
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("no header row: %w", err)
	}
	head = slices.Clone(head) // the reader reuses its record
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	find := func(field, name string) (int, error) {
		if name == "" {
			return -1, nil
		}
		i, ok := col[name]
		if !ok {
			return -1, invalid("arrival."+field, "column %q is not in %s (columns: %s)", name, a.Trace, strings.Join(head, ", "))
		}
		return i, nil
	}
	timeName := a.TimeColumn
	if timeName == "" {
		timeName = "TIMESTAMP"
		if _, ok := col[timeName]; !ok {
			timeName = strings.TrimSpace(head[0])
		}
	}
	if timeName == "" {
		return nil, invalid("arrival.time_column", "the first column of %s has no name: name the time column", a.Trace)
	}
	ti, err := find("time_column", timeName)
	if err != nil {
		return nil, err
	}
	si, err := find("size_column", a.SizeColumn)
	if err != nil {
		return nil, err
	}
	yi, err := find("type_column", a.TypeColumn)
	if err != nil {
		return nil, err
	}
	ni, err := find("tenant_column", a.TenantColumn)
	if err != nil {
		return nil, err
	}
	type row struct {
		t           float64 // seconds from an arbitrary origin
		size        float64
		typ, tenant string
	}
	var rows []row
	var origin time.Time
	for line := 2; ; line++ {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(rows) >= MaxTasks {
			return nil, fmt.Errorf("more than %d rows", MaxTasks)
		}
		get := func(i int) (string, error) {
			if i >= len(rec) {
				return "", fmt.Errorf("row %d has %d fields, no column %q", line, len(rec), head[i])
			}
			return strings.TrimSpace(rec[i]), nil
		}
		var rw row
		ts, err := get(ti)
		if err != nil {
			return nil, err
		}
		if rw.t, err = traceSeconds(ts, &origin); err != nil {
			return nil, fmt.Errorf("row %d: %w", line, err)
		}
		if si >= 0 {
			s, err := get(si)
			if err != nil {
				return nil, err
			}
			v, perr := strconv.ParseFloat(s, 64)
			if perr != nil || math.IsNaN(v) || v < 0 || v > 1e12 {
				return nil, fmt.Errorf("row %d: size %q is not a number in 0..1e12", line, s)
			}
			rw.size = v
		}
		if yi >= 0 {
			if rw.typ, err = get(yi); err != nil {
				return nil, err
			}
		}
		if ni >= 0 {
			if rw.tenant, err = get(ni); err != nil {
				return nil, err
			}
		}
		rows = append(rows, rw)
	}
	if len(rows) == 0 {
		return nil, errors.New("no rows")
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].t < rows[j].t })
	t0 := rows[0].t
	if (rows[len(rows)-1].t-t0)*a.TimeScale > MaxDuration.Seconds() {
		return nil, fmt.Errorf("spans %.0fs scaled, beyond %v", (rows[len(rows)-1].t-t0)*a.TimeScale, MaxDuration)
	}
	// The multiplier keeps or repeats rows evenly and deterministically
	// (row i gives floor((i+1)m) - floor(im) arrivals), so every seed sees
	// the same arrivals; repeats are spread evenly up to the next row.
	tr := &traceData{}
	m := a.RateMultiplier
	for i, rw := range rows {
		k := int(math.Floor(float64(i+1)*m+1e-9) - math.Floor(float64(i)*m+1e-9))
		at := (rw.t - t0) * a.TimeScale
		next := at
		if i+1 < len(rows) {
			next = (rows[i+1].t - t0) * a.TimeScale
		}
		for j := 0; j < k; j++ {
			if len(tr.at) >= MaxTasks {
				return nil, fmt.Errorf("more than %d arrivals at rate_multiplier %g", MaxTasks, m)
			}
			tj := at + (next-at)*float64(j)/float64(k)
			tr.at = append(tr.at, time.Duration(tj*float64(time.Second)))
			tr.size = append(tr.size, rw.size)
			if yi >= 0 {
				tr.typ = append(tr.typ, rw.typ)
			}
			if ni >= 0 {
				tr.tenant = append(tr.tenant, rw.tenant)
			}
		}
	}
	if len(tr.at) == 0 {
		return nil, fmt.Errorf("no arrivals left at rate_multiplier %g", m)
	}
	tr.span = tr.at[len(tr.at)-1]
	tr.meanGap = tr.span / time.Duration(max(len(tr.at)-1, 1))
	return tr, nil
}

// arrivalAt is when arrival i comes: past the trace's end it is replayed
// again, one mean gap after the previous pass's last arrival.
func (tr *traceData) arrivalAt(i int) time.Duration {
	n := len(tr.at)
	return time.Duration(i/n)*(tr.span+tr.meanGap) + tr.at[i%n]
}

// traceTask gives arrival t its type, size and flow from the trace: the
// type and tenant columns where the trace has them, else drawn as a
// Poisson arrival's are.
func (s *sim) traceTask(t *task) {
	tr := s.sc.trace
	i := t.idx % len(tr.at)
	t.size = tr.size[i]
	if tr.typ != nil {
		t.typ = tr.typ[i]
	} else {
		t.typ = s.pickType()
	}
	if s.fc == nil {
		return
	}
	if tr.tenant == nil {
		s.pickFlow(t)
		return
	}
	for j := range s.sc.Arrival.Flows {
		if fl := &s.sc.Arrival.Flows[j]; fl.Tenant == tr.tenant[i] {
			t.flow, t.priority, t.tenant = j, fl.Priority, fl.Tenant
			if fl.Deadline > 0 {
				t.expiry = t.submit + fl.Deadline.D()
			}
			return
		}
	}
}
