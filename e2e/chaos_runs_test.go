package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/mlsched/mlsched/e2e/harness"
)

// runLogMessage is the worker's debug line as a dispatch's model starts
// (worker/task.go); the chaos runs set MLSCHED_LOG_LEVEL=debug to get it.
const runLogMessage = "running the task"

// runCounts is how many times the workers ran each task, counted from their
// own logs over every run of each process: what a task cost, which
// max_attempts must bound even when a server restart lost the attempt
// streams (issue 39).
// batched counts the runs made in a call of two tasks or more (a
// batching model's).
// seen keeps each task's runs as "attempt@node model time", to show where
// a task that ran too often ran. repeats counts, per task, the runs of an
// attempt number that had run already (a dispatch run again on its
// redelivery; a pipeline's steps number their attempts each from 1).
type runCounts struct {
	byTask   map[string]int
	seen     map[string][]string
	attempts map[string]int // task id + "#" + attempt: runs
	repeats  map[string]int
	batched  int
}

func newRunCounts() *runCounts {
	return &runCounts{byTask: map[string]int{}, seen: map[string][]string{}, attempts: map[string]int{}, repeats: map[string]int{}}
}

// runs lists a task's runs in the order the logs gave them.
func (r *runCounts) runs(id string) []string { return r.seen[id] }

// countRuns reads every worker's logs.
func countRuns(workers []*harness.Worker) *runCounts {
	runs := newRunCounts()
	for _, w := range workers {
		runs.add(w.Logs())
	}
	return runs
}

// add counts the run lines of one process's logs (JSON lines; anything
// else, such as a line cut by kill -9, is skipped).
func (r *runCounts) add(logs string) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), runLogMessage) {
			continue
		}
		var l struct {
			Message string `json:"message"`
			TaskID  string `json:"task_id"`
			Batch   int    `json:"batch"`
			Attempt int    `json:"attempt"`
			Node    string `json:"node"`
			Model   string `json:"model"`
			Time    string `json:"time"`
		}
		if json.Unmarshal(line, &l) != nil || l.Message != runLogMessage || l.TaskID == "" {
			continue
		}
		r.byTask[l.TaskID]++
		if key := fmt.Sprintf("%s#%d", l.TaskID, l.Attempt); r.attempts[key] > 0 {
			r.repeats[l.TaskID]++
		} else {
			r.attempts[key] = 1
		}
		r.seen[l.TaskID] = append(r.seen[l.TaskID], fmt.Sprintf("#%d@%s %s %s", l.Attempt, l.Node, l.Model, l.Time))
		if l.Batch >= 2 {
			r.batched++
		}
	}
}

// over returns the tasks that ran more than max times.
func (r *runCounts) over(max int) map[string]int {
	return r.overBy(func(string) int { return max })
}

// overBy returns the tasks that ran more than bound(id) times.
func (r *runCounts) overBy(bound func(id string) int) map[string]int {
	out := map[string]int{}
	for id, n := range r.byTask {
		if n > bound(id) {
			out[id] = n
		}
	}
	return out
}

func (r *runCounts) total() (n int) {
	for _, c := range r.byTask {
		n += c
	}
	return n
}

// repeated sums the repeats of the tasks keep selects.
func (r *runCounts) repeated(keep func(id string) bool) (n int) {
	for id, c := range r.repeats {
		if keep(id) {
			n += c
		}
	}
	return n
}

func (r *runCounts) most() (n int) {
	for _, c := range r.byTask {
		n = max(n, c)
	}
	return n
}
