package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

type point struct{ x, y float64 }

type line struct {
	name   string
	dashed bool
	points []point
}

const (
	plotW, plotH                    = 720, 420
	marginL, marginR, marginT, marB = 70, 200, 40, 50
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"}

// plot draws lines on linear axes from 0, y against N, as an SVG document
// (written by hand: the standard library has no plotting).
func plot(title, unit string, ls []line) string {
	maxX, maxY := 1.0, 0.0
	for _, l := range ls {
		for _, p := range l.points {
			maxX, maxY = math.Max(maxX, p.x), math.Max(maxY, p.y)
		}
	}
	yTop, yStep := niceScale(maxY)
	xTop, xStep := niceScale(maxX)
	iw, ih := float64(plotW-marginL-marginR), float64(plotH-marginT-marB)
	px := func(x float64) float64 { return marginL + iw*x/xTop }
	py := func(y float64) float64 { return marginT + ih*(1-y/yTop) }

	// The legend, right of the plot, one row per line: the document grows to hold it
	// (a results file plots every run of several passes, often more rows than the
	// plot is high), at about 7 px a character of the legend's names.
	width, height := plotW, plotH
	for i, l := range ls {
		width = max(width, plotW-marginR+46+7*len(l.name)+10)
		height = max(height, marginT+18*i+18)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", marginL, html.EscapeString(title))
	for y := 0.0; y <= yTop+yStep/2; y += yStep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px(0), py(y), px(xTop), py(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", px(0)-6, py(y)+4, num(y))
	}
	for x := 0.0; x <= xTop+xStep/2; x += xStep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px(x), py(0), px(x), py(yTop))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), py(0)+18, num(x))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">volumes created at once (N)</text>`+"\n", px(xTop/2), plotH-8)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", py(yTop/2), html.EscapeString(unit))
	for i, l := range ls {
		color := palette[i%len(palette)]
		dash := ""
		if l.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for _, p := range l.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.x), py(p.y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		for _, p := range l.points {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s N=%s: %s %s</title></circle>`+"\n",
				px(p.x), py(p.y), color, html.EscapeString(l.name), num(p.x), num(p.y), html.EscapeString(unit))
		}
		ly := marginT + 18*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", plotW-marginR+15, ly, plotW-marginR+40, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", plotW-marginR+46, ly+4, html.EscapeString(l.name))
	}
	if len(ls) == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">no complete run yet</text>`+"\n", px(xTop/2), py(yTop/2))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceScale rounds max up to a multiple of a 1, 2 or 5 step giving about five ticks.
func niceScale(max float64) (top, step float64) {
	if max <= 0 {
		return 1, 0.2
	}
	raw := max / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step = mag * 10
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			step = m * mag
			break
		}
	}
	return math.Ceil(max/step) * step, step
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v) || math.Abs(v) >= 10:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
