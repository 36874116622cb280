package relay

import (
	"slices"
	"testing"
)

// Every call goes to the smallest writer whose batch size holds all of its messages, so that no
// partition's messages of one call are split over two produce requests.
func TestWriterClasses(t *testing.T) {
	for _, c := range []struct {
		batch int
		want  []int
	}{
		{1, []int{1}},
		{8, []int{8}},
		{9, []int{8, 9}},
		{500, []int{8, 64, 500}},
		{512, []int{8, 64, 512}},
		{513, []int{8, 64, 512, 513}},
		{10000, []int{8, 64, 512, 4096, 10000}},
	} {
		if got := writerClasses(c.batch); !slices.Equal(got, c.want) {
			t.Errorf("writerClasses(%d) = %v, want %v", c.batch, got, c.want)
		}
	}

	cfg := testConfig("postgres://localhost/db", []string{"127.0.0.1:9092"}, "events")
	cfg.BatchSize = 500
	p, err := newPublisher(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.close() })
	for _, c := range []struct{ n, want int }{{1, 8}, {8, 8}, {9, 64}, {64, 64}, {65, 500}, {500, 500}} {
		w := p.writerFor(c.n)
		if w.BatchSize != c.want || w.BatchSize < c.n {
			t.Errorf("writerFor(%d) has BatchSize %d, want %d", c.n, w.BatchSize, c.want)
		}
		if w.Transport != p.transport {
			t.Errorf("writerFor(%d) does not share the publisher's transport", c.n)
		}
	}
}
