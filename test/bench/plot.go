package main

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colorBaseline = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	colorRelay    = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorTarget   = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// writePlot draws the drain rates (left) and the latency percentiles (right) into one PNG.
func writePlot(path string, res *Results) error {
	drains, err := drainPlot(res)
	if err != nil {
		return err
	}
	lat, err := latencyPlot(res)
	if err != nil {
		return err
	}
	peers, err := debeziumPlot(res)
	if err != nil {
		return err
	}
	const w = 30 * vg.Centimeter
	h := 12 * vg.Centimeter
	if peers != nil {
		h *= 2
	}
	img := vgimg.New(w, h)
	dc := draw.New(img)
	if peers != nil {
		// The side by side with Debezium below the two charts, across the whole width.
		peers.Draw(draw.Crop(dc, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -h/2))
		dc = draw.Crop(dc, 0, 0, h/2, 0)
	}
	// The drain chart needs the wider tile for its labels: draw it on 60% of the width.
	left := draw.Crop(dc, 0, -w*0.4, 0, 0)
	right := draw.Crop(dc, w*0.6, 0, 0, 0)
	drains.Draw(draw.Crop(left, vg.Millimeter*3, -vg.Millimeter*3, vg.Millimeter*3, -vg.Millimeter*3))
	lat.Draw(draw.Crop(right, vg.Millimeter*3, -vg.Millimeter*5, vg.Millimeter*3, -vg.Millimeter*3))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func drainPlot(res *Results) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Drain rate (events/s, higher is better)"
	var names []string
	var base, relay plotter.Values
	var labels plotter.XYLabels
	// Reverse order: a horizontal chart draws its first bar at the bottom.
	var measured []*DrainResult
	for _, d := range res.Drains {
		if d.Measured {
			measured = append(measured, d)
		}
	}
	for i := len(measured) - 1; i >= 0; i-- {
		d := measured[i]
		names = append(names, d.Name)
		if d.Key == keyTuned || d.Key == keyDefaults || d.Key == keyCeiling {
			base, relay = append(base, d.Rate), append(relay, 0)
		} else {
			base, relay = append(base, 0), append(relay, d.Rate)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: d.Rate, Y: float64(len(names) - 1)})
		labels.Labels = append(labels.Labels, " "+fmtInt(d.Rate))
	}
	if len(names) == 0 {
		p.Title.Text += ": nothing measured"
		return p, nil
	}
	const width = 12
	for _, s := range []struct {
		v plotter.Values
		c color.Color
	}{{base, colorBaseline}, {relay, colorRelay}} {
		bars, err := plotter.NewBarChart(s.v, vg.Points(width))
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.Color = s.c
		bars.LineStyle.Width = 0
		p.Add(bars)
	}
	l, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(l)
	maxRate := 0.0
	for _, xy := range labels.XYs {
		maxRate = max(maxRate, xy.X)
	}
	p.X.Min, p.X.Max = 0, maxRate*1.25 // room for the value labels
	p.X.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		step := niceStep((hi - lo) / 5)
		var ticks []plot.Tick
		for v := 0.0; v <= hi; v += step {
			ticks = append(ticks, plot.Tick{Value: v, Label: fmtInt(v)})
		}
		return ticks
	})
	p.NominalY(names...)
	p.Add(plotter.NewGrid())
	return p, nil
}

func latencyPlot(res *Results) (*plot.Plot, error) {
	p := plot.New()
	l := res.Latency
	if l == nil || !l.Measured {
		p.Title.Text = "Latency: not measured"
		return p, nil
	}
	p.Title.Text = fmt.Sprintf("Commit to consumer at %s events/s (ms)", fmtInt(l.Rate))
	vals := plotter.Values{l.P50, l.P95, l.P99, l.Max}
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return nil, err
	}
	bars.Color = colorRelay
	bars.LineStyle.Width = 0
	p.Add(bars)
	var labels plotter.XYLabels
	for i, v := range vals {
		labels.XYs = append(labels.XYs, plotter.XY{X: float64(i), Y: v})
		labels.Labels = append(labels.Labels, fmt.Sprintf("%.1f", v))
	}
	lb, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign = draw.XCenter
	}
	lb.Offset = vg.Point{Y: vg.Points(3)}
	p.Add(lb)
	target, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: targetP99Ms}, {X: 3.5, Y: targetP99Ms}})
	if err != nil {
		return nil, err
	}
	target.Color = colorTarget
	target.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(target)
	p.Legend.Add(fmt.Sprintf("p99 target %.0f ms", targetP99Ms), target)
	p.Legend.Top = true
	p.NominalX("p50", "p95", "p99", "max")
	p.Y.Min = 0
	p.Y.Max = max(l.Max, targetP99Ms) * 1.15
	p.Add(plotter.NewGrid())
	return p, nil
}

// niceStep rounds a tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}
