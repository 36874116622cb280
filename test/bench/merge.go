package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// MergedRun records a run of some scenarios whose results were merged into an earlier full run
// (-merge-into): the report says which figures come from which run.
type MergedRun struct {
	Scenarios []string  `json:"scenarios"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	LoadAvg   string    `json:"loadAvg"`
	KafkaJVM  string    `json:"kafkaJVM,omitempty"`
}

// mergeInto reads the results of an earlier run from path (written with -json) and puts into
// them what run measured: its drains replace those of the same key (or are added), every other
// result it has replaces the earlier one, its notes are added. A scenario's ratios compare
// figures it measured itself, in one run; merging moves no ratio across runs.
func mergeInto(path string, run *Results, scenarios []string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var base Results
	if err := json.Unmarshal(b, &base); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, d := range run.Drains {
		d.MergedRun = &run.Started
		if i := slices.IndexFunc(base.Drains, func(o *DrainResult) bool { return o.Key == d.Key }); i >= 0 {
			base.Drains[i] = d
		} else {
			base.Drains = append(base.Drains, d)
		}
	}
	if run.WritePath != nil && base.WritePath != nil && run.WritePath.Err == "" {
		// Some states of the write path (-write-states): their rows replace the same level's, the
		// other levels stay. Each row's ratios are within its own level.
		merged := *base.WritePath
		merged.Rows = slices.Clone(base.WritePath.Rows)
		for _, r := range run.WritePath.Rows {
			if i := slices.IndexFunc(merged.Rows, func(o WritePathRow) bool { return o.Writers == r.Writers && o.Relay == r.Relay }); i >= 0 {
				merged.Rows[i] = r
			} else {
				merged.Rows = append(merged.Rows, r)
			}
		}
		if len(run.WritePath.Rows) >= len(base.WritePath.Rows) { // every level measured again
			merged.Started, merged.Settings, merged.Round, merged.Rounds = run.WritePath.Started, run.WritePath.Settings, run.WritePath.Round, run.WritePath.Rounds
		}
		run.WritePath = &merged
	}
	bv, rv := reflect.ValueOf(&base).Elem(), reflect.ValueOf(run).Elem()
	for i := range rv.NumField() {
		f := rv.Field(i)
		if f.Kind() == reflect.Pointer && !f.IsNil() {
			bv.Field(i).Set(f)
		}
	}
	for _, n := range run.Notes {
		base.Notes = append(base.Notes, n+" ("+strings.Join(scenarios, ", ")+" run of "+run.Started.Format("2006-01-02 15:04 MST")+")")
	}
	base.Merged = append(base.Merged, MergedRun{Scenarios: scenarios, Started: run.Started, Finished: run.Finished, LoadAvg: run.Machine.LoadAvg, KafkaJVM: run.Machine.KafkaJVM})
	base.Config = run.Config
	return &base, nil
}
