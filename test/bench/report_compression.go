package main

import (
	"fmt"
	"strings"
)

// compressionCodecs are the codecs of --compression the drain scenario measures, each a drain of
// the snapshot relay keyed keySnap1-<codec>; "none" is the base (the same drain as keySnap1, in
// the same group, so that -drains can measure the group alone).
var compressionCodecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// writeCompression writes the section that compares the snapshot relay's drains by codec: rate,
// CPU per event by process and the bytes per event the topic holds on the broker's disk.
func writeCompression(b *strings.Builder, res *Results) {
	base := res.drain(keySnap1 + "-none")
	if base == nil || !base.Measured {
		return
	}
	var ds []*DrainResult
	for _, c := range compressionCodecs {
		if d := res.drain(keySnap1 + "-" + c); d != nil {
			ds = append(ds, d)
		}
	}
	fmt.Fprintf(b, "## Compression\n\n")
	fmt.Fprintf(b, "The snapshot relay's drain (1 shard, %s events, %s partitions) with each `--compression` codec "+
		"(`spec.publish.compression`). *On disk* is the topic's log on the broker after the drain, as the broker describes "+
		"its log directories (the topic keeps the producer's codec, Kafka's default `compression.type=producer`); CPU is "+
		"µs per event by process. A drain fills batches of hundreds of events per partition, the best case for a codec; at "+
		"steady rates a produce request carries a few events per partition and compresses far less.\n\n",
		drainSize(res), fmtInt(float64(res.Config.partitions)))
	fmt.Fprintf(b, "| codec | events/s | vs none | relay µs/event | PostgreSQL | broker | on disk, bytes/event | vs none |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range ds {
		codec := d.Compression
		if !d.Measured || d.CPU == nil {
			fmt.Fprintf(b, "| %s | %s | | | | | | |\n", codec, orDash(firstLine(d.Err, 80)))
			continue
		}
		per := func(s float64) string { return fmt.Sprintf("%.1f", s/float64(d.Events)*1e6) }
		disk, diskRatio := "-", "-"
		if d.TopicBytes > 0 {
			disk = fmt.Sprintf("%.0f", float64(d.TopicBytes)/float64(d.Events))
			if base.TopicBytes > 0 {
				diskRatio = fmt.Sprintf("%.2fx", float64(d.TopicBytes)/float64(base.TopicBytes))
			}
		}
		fmt.Fprintf(b, "| %s | %s | %.2fx | %s | %s | %s | %s | %s |\n", codec, fmtInt(d.Rate), d.Rate/base.Rate,
			per(d.CPU.Relay), per(d.CPU.Postgres), per(d.CPU.Kafka), disk, diskRatio)
	}
	fmt.Fprintln(b)
}
