package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/mlsched/mlsched/e2e/harness"
	"github.com/mlsched/mlsched/worker/digits"
)

// The batching scenarios: mlsched in front of a model whose every call has
// a fixed cost, the scikit-learn digits classifier over OIP v2
// (deployments/models/digits_server.py: a Python HTTP request and a
// predict call per inference request), hosted on every node without
// batching (digits) and with batch {max_size: 32, max_delay: 5ms}
// (digits-batch), in the same run. Every task classifies one held-out
// image. docs/benchmarks.md has the figures.
const (
	ScenarioDigits      = "digits"
	ScenarioDigitsBatch = "digits-batch"
)

// digitsBatch is digits-batch's batch section.
const digitsBatch = "{max_size: 32, max_delay: 5ms}"

func isDigits(name string) bool { return name == ScenarioDigits || name == ScenarioDigitsBatch }

// digitsPython is a Python 3 that imports scikit-learn.
func digitsPython() (string, error) {
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import sklearn.linear_model").Run() == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("the %s scenarios need a python3 that imports scikit-learn (make sklearn)", ScenarioDigits)
}

// digitsModels starts the model server and writes the models file of the
// digits scenarios: one OIP v2 model, batching in digits-batch.
func (r *run) digitsModels(ctx context.Context) (string, error) {
	py, err := digitsPython()
	if err != nil {
		return "", err
	}
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	port, err := harness.FreePort()
	if err != nil {
		return "", err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	srv, err := r.g.Process("digits-server", py, []string{filepath.Join(root, "deployments/models/digits_server.py"),
		"--port", strconv.Itoa(port), "--models", "logreg"}, nil)
	if err != nil {
		return "", err
	}
	if err := srv.StartReady(func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v2/health/ready", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("ready: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return "", err
	}
	r.cpu = append(r.cpu, procGroup{"digits_server.py", []int{srv.Pid()}})
	batch := ""
	if r.name == ScenarioDigitsBatch {
		batch = "\n    batch: " + digitsBatch
	}
	file := fmt.Sprintf("# written by mlsched-bench: the digits classifier over OIP v2\nmodels:\n"+
		"  - name: digits\n    types: [%s]\n    executor: http\n    timeout: 30s%s\n"+
		"    http: {url: %q, mode: oip, model: digits-logreg, inputs: [{name: pixels, datatype: FP32, shape: [1, 64]}]}\n",
		taskType, batch, url)
	path := r.g.Dir + "/models.yaml"
	return path, os.WriteFile(path, []byte(file), 0o644)
}

// digitsPayload is one held-out image, {"pixels": [64 numbers]}.
func digitsPayload() (string, error) {
	all, err := digits.Dataset()
	if err != nil {
		return "", err
	}
	_, held := digits.Split(all)
	b, err := json.Marshal(map[string]any{"pixels": held[0].Pixels})
	return string(b), err
}
