package console

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"
)

// The charts are SVG drawn on the server: a viewBox that scales with the
// page, the axes' labels in the SVG, and a title and description for
// screen readers. Colours come from the style sheet (classes), so the
// charts follow its light and dark schemes.

const (
	chartW, chartH = 600, 200
	padL, padR     = 44, 22
	padT, padB     = 10, 24
)

// niceMax rounds v up to 1, 2 or 5 times a power of ten.
func niceMax(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0")
	case v >= 1:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

// frame draws the axes and grid of a chart whose values run up to top,
// over the minutes from `from`.
func frame(b *strings.Builder, label string, from time.Time, n int, top float64) {
	fmt.Fprintf(b, `<svg class="chart-svg" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		chartW, chartH, template.HTMLEscapeString(label))
	fmt.Fprintf(b, `<title>%s</title>`, template.HTMLEscapeString(label))
	plotH := float64(chartH - padT - padB)
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		y := float64(padT) + plotH - plotH*float64(i)/4
		fmt.Fprintf(b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padL, chartW-padR, y, y)
		fmt.Fprintf(b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y+4, fmtTick(v))
	}
	plotW := float64(chartW - padL - padR)
	for i := 0; i <= n; i += 15 {
		x := float64(padL) + plotW*float64(i)/float64(n)
		fmt.Fprintf(b, `<text class="tick" x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, chartH-6, from.Add(time.Duration(i)*time.Minute).UTC().Format("15:04"))
	}
}

// barChart draws one bar per value.
func barChart(label string, from time.Time, vals []float64, valFmt, class string) template.HTML {
	top := 0.0
	for _, v := range vals {
		top = max(top, v)
	}
	top = niceMax(top)
	var b strings.Builder
	frame(&b, label, from, len(vals), top)
	plotW, plotH := float64(chartW-padL-padR), float64(chartH-padT-padB)
	bw := plotW / float64(max(len(vals), 1))
	for i, v := range vals {
		if v <= 0 {
			continue
		}
		h := plotH * v / top
		fmt.Fprintf(&b, `<rect class="bar %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %s</title></rect>`, class,
			float64(padL)+bw*float64(i)+0.5, float64(padT)+plotH-h, max(bw-1, 0.5), h,
			from.Add(time.Duration(i)*time.Minute).UTC().Format("15:04"), fmt.Sprintf(valFmt, v))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// lineChart draws two series (p50 and p99) as lines with a legend.
func lineChart(label string, from time.Time, a, z []float64) template.HTML {
	top := 0.0
	for _, v := range z {
		top = max(top, v)
	}
	for _, v := range a {
		top = max(top, v)
	}
	top = niceMax(top)
	var b strings.Builder
	frame(&b, label, from, len(a), top)
	plotW, plotH := float64(chartW-padL-padR), float64(chartH-padT-padB)
	step := plotW / float64(max(len(a), 1))
	line := func(vals []float64, class string) {
		var pts []string
		flush := func() {
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, class, strings.Join(pts, " "))
				if len(pts) == 1 {
					fmt.Fprintf(&b, `<circle class="dot %s" r="3" cx="%s" cy="%s"/>`, class, strings.Split(pts[0], ",")[0], strings.Split(pts[0], ",")[1])
				}
			}
			pts = nil
		}
		for i, v := range vals {
			if v <= 0 {
				flush()
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(padL)+step*(float64(i)+0.5), float64(padT)+plotH-plotH*v/top))
		}
		flush()
	}
	line(z, "p99")
	line(a, "p50")
	fmt.Fprintf(&b, `<g class="legend"><rect class="key p50" x="%d" y="%d" width="10" height="10"/><text class="tick" x="%d" y="%d">p50</text>`+
		`<rect class="key p99" x="%d" y="%d" width="10" height="10"/><text class="tick" x="%d" y="%d">p99</text></g>`,
		padL+8, padT+2, padL+22, padT+11, padL+58, padT+2, padL+72, padT+11)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
