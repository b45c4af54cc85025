package simulate

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

var palette = []string{"#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#000000", "#ff7f0e", "#17becf"}

// WriteSVG plots each policy's rolling first-attempt success rate against
// simulated time as a self-contained SVG image (no dependency).
func (r *Report) WriteSVG(w io.Writer) error {
	const (
		width, height         = 960, 480
		left, right, top, bot = 70, 170, 40, 50
		plotW, plotH          = width - left - right, height - top - bot
		yTicks                = 5
	)
	maxT, minY := 0.0, 1.0
	for _, res := range r.Results {
		for _, p := range res.Curve {
			maxT = math.Max(maxT, p.AtS)
			minY = math.Min(minY, p.Success)
		}
	}
	if maxT == 0 {
		maxT = 1
	}
	// Round the y range down to a multiple of 5 points.
	lo := math.Floor(minY*20) / 20
	if lo >= 1 {
		lo = 0.95
	}
	x := func(t float64) float64 { return left + t/maxT*plotW }
	y := func(v float64) float64 { return top + (1-(v-lo)/(1-lo))*plotH }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left,
		html.EscapeString(fmt.Sprintf("%s: first-attempt success over the last %d tasks (seed %d, %d tasks)", r.Scenario, curveWindow(r.Tasks), r.Seed, r.Tasks)))
	// Axes and grid.
	for i := 0; i <= yTicks; i++ {
		v := lo + (1-lo)*float64(i)/yTicks
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), left+plotW, y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%.1f%%</text>`+"\n", left-6, y(v)+4, v*100)
	}
	step := niceStep(maxT / 6)
	for t := 0.0; t <= maxT+1e-9; t += step {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#444"/>`+"\n", x(t), top+plotH, x(t), top+plotH+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%gs</text>`+"\n", x(t), top+plotH+18, t)
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">simulated time</text>`+"\n", left+plotW/2, height-10)
	if r.ChangeAtS != nil && *r.ChangeAtS <= maxT {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="4 3"/>`+"\n", x(*r.ChangeAtS), top, x(*r.ChangeAtS), top+plotH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#666">change</text>`+"\n", x(*r.ChangeAtS)+3, top+12)
	}
	for i, res := range r.Results {
		col := palette[i%len(palette)]
		width := 1.2
		if res.Policy == Oracle {
			width = 2
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="`, col, width)
		for j, p := range res.Curve {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(b, "%.1f,%.1f", x(p.AtS), y(p.Success))
		}
		b.WriteString(`"/>` + "\n")
		ly := top + 10 + i*20
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", left+plotW+12, ly, left+plotW+32, ly, col)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s %.2f%%</text>`+"\n", left+plotW+38, ly+4, html.EscapeString(res.Policy), res.FirstSuccess*100)
	}
	b.WriteString("</svg>\n")
	return b.Flush()
}

// niceStep rounds a raw axis step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}
