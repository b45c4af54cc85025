package worker

import (
	"github.com/mlsched/mlsched/worker/executor"
	"github.com/mlsched/mlsched/worker/model"
)

// Task is what a Go handler receives.
type Task = executor.Task

// Handler is an in-process model; see executor.Handler.
type Handler = executor.Handler

// BatchHandler is the batch variant of a Handler; see executor.BatchHandler.
type BatchHandler = executor.BatchHandler

// Result is one task's answer from a BatchHandler.
type Result = executor.Result

// TaskError is a task (bad input) error with a message for the result.
type TaskError = executor.TaskError

// ModelSpec is one hosted model, as in the models file.
type ModelSpec = model.Spec

// ErrTaskError marks a handler error caused by the task's input: reported as
// task_error, never counted against the model, never retried.
var ErrTaskError = executor.ErrTaskError

// ModelCost is a model's declared price (ModelSpec.Cost), announced in the
// node's heartbeat for the dispatcher's cost policy.
type ModelCost = model.CostSpec
