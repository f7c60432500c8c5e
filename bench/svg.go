package bench

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// WriteSVG draws the accept-to-reply latency percentiles (p50, p90, p99) of
// fleet results and their floors against the lane count, on a logarithmic
// latency axis, as a self-contained SVG (standard library only).
func WriteSVG(w io.Writer, rs []Result, title, subtitle string) error {
	if len(rs) == 0 {
		return errors.New("bench: no results to chart")
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Result) int { return a.Lanes - b.Lanes })
	type series struct {
		name  string
		color string
		dash  string
		pts   []float64 // ms, per result; NaN when absent
	}
	pct := []struct {
		name string
		dash string
		get  func(Result) time.Duration
	}{
		{"p50", "", func(r Result) time.Duration { return r.P50 }},
		{"p90", "7 4", func(r Result) time.Duration { return r.P90 }},
		{"p99", "2 4", func(r Result) time.Duration { return r.P99 }},
	}
	var all []series
	var omitted []string
	for _, who := range []struct {
		name, color string
		floor       bool
	}{{"fleet", "#d1495b", false}, {"floor", "#2e86ab", true}} {
		for _, p := range pct {
			s := series{name: who.name + " " + p.name, color: who.color, dash: p.dash}
			for _, r := range rs {
				x := r
				if who.floor {
					if r.Floor == nil {
						s.pts = append(s.pts, math.NaN())
						continue
					}
					x = *r.Floor
				}
				ms := float64(p.get(x)) / 1e6
				if ms <= 0 {
					omitted = append(omitted, fmt.Sprintf("%s at %s (%s)", s.name, lanesLabel(r.Lanes), fmtDur(p.get(x))))
					ms = math.NaN()
				}
				s.pts = append(s.pts, ms)
			}
			all = append(all, s)
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range all {
		for _, v := range s.pts {
			if !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		return errors.New("bench: no latencies to chart")
	}
	yMin := math.Pow(10, math.Floor(math.Log10(lo)))
	yMax := math.Pow(10, math.Ceil(math.Log10(hi)))
	if yMax <= yMin {
		yMax = yMin * 10
	}

	const (
		width, height         = 820, 480
		left, right, top, bot = 78, 190, 64, 62
		plotW, plotH          = width - left - right, height - top - bot
		font                  = `font-family="Helvetica, Arial, sans-serif"`
	)
	xs := make([]float64, len(rs))
	maxL := math.Log2(float64(rs[len(rs)-1].Lanes))
	for i, r := range rs {
		switch {
		case len(rs) == 1:
			xs[i] = left + plotW/2
		case maxL == 0:
			xs[i] = left + float64(i)*plotW/float64(len(rs)-1)
		default:
			xs[i] = left + 20 + math.Log2(float64(r.Lanes))/maxL*(plotW-40)
		}
	}
	y := func(ms float64) float64 {
		return top + plotH - (math.Log10(ms)-math.Log10(yMin))/(math.Log10(yMax)-math.Log10(yMin))*plotH
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="26" %s font-size="17" font-weight="bold" fill="#222">%s</text>`+"\n", left, font, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%d" y="46" %s font-size="12" fill="#555">%s</text>`+"\n", left, font, html.EscapeString(subtitle))
	// Grid and y labels: every decade, with 2 and 5 between.
	for dec := yMin; dec < yMax*1.0001; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := dec * m
			if v > yMax*1.0001 {
				break
			}
			yy := y(v)
			stroke, sw := "#e6e6e6", 1.0
			if m == 1 {
				stroke = "#c8c8c8"
			}
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`+"\n", left, yy, left+plotW, yy, stroke, sw)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" %s font-size="11" fill="#444" text-anchor="end">%s</text>`+"\n", left-6, yy+4, font, msLabel(v))
		}
	}
	// X ticks.
	for i, r := range rs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e6e6e6"/>`+"\n", xs[i], top, xs[i], top+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" %s font-size="12" fill="#444" text-anchor="middle">%d</text>`+"\n", xs[i], top+plotH+18, font, r.Lanes)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" %s font-size="13" fill="#222" text-anchor="middle">lanes (one message in flight each; log scale)</text>`+"\n",
		left+plotW/2, height-18, font)
	fmt.Fprintf(&b, `<text transform="translate(20,%d) rotate(-90)" %s font-size="13" fill="#222" text-anchor="middle">accept-to-reply latency (log scale)</text>`+"\n",
		top+plotH/2, font)
	// Series.
	for _, s := range all {
		var pts []string
		for i, v := range s.pts {
			if !math.IsNaN(v) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs[i], y(v)))
			}
		}
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2.2"%s/>`+"\n", strings.Join(pts, " "), s.color, dash)
		}
		for i, v := range s.pts {
			if !math.IsNaN(v) {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s, %d lanes: %s</title></circle>`+"\n",
					xs[i], y(v), s.color, html.EscapeString(s.name), rs[i].Lanes, msLabel(v))
			}
		}
	}
	// Legend.
	lx, ly := left+plotW+18, top+6
	for i, s := range all {
		yy := ly + i*22
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.2"%s/>`+"\n", lx, yy, lx+34, yy, s.color, dash)
		fmt.Fprintf(&b, `<circle cx="%d" cy="%d" r="3.5" fill="%s"/>`+"\n", lx+17, yy, s.color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s font-size="12" fill="#222">%s</text>`+"\n", lx+42, yy+4, font, html.EscapeString(s.name))
	}
	if len(omitted) > 0 {
		// A log axis has no place for zero or negative latencies (the fleet's
		// reply can arrive before its 202).
		fmt.Fprintf(&b, `<text x="%d" y="%d" %s font-size="11" fill="#555">not drawn (≤ 0, the reply arrived before the acceptance): %s</text>`+"\n",
			left, height-4, font, html.EscapeString(strings.Join(omitted, "; ")))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// msLabel renders a latency in milliseconds for an axis.
func msLabel(ms float64) string {
	switch {
	case ms >= 1000:
		return strings.TrimSuffix(fmt.Sprintf("%.3g", ms/1000), ".0") + " s"
	case ms >= 1:
		return fmt.Sprintf("%.3g ms", ms)
	default:
		return fmt.Sprintf("%.3g ms", ms)
	}
}

func lanesLabel(n int) string {
	if n == 1 {
		return "1 lane"
	}
	return fmt.Sprintf("%d lanes", n)
}
