package protocol_test

import (
	"fmt"

	"github.com/mlsched/mlsched/shared/protocol"
)

// A consumer of tasks decodes each message once: a rejection carries a code
// and, when the id could be read, the id to key the rejected result by.
func ExampleDecodeTask() {
	for _, msg := range []string{
		`{"id":"t1","type":"ocr","timeout_ms":2000}`,
		`{"id":"t2","type":"ocr","timeout_ms":-1}`,
		`{"id":"t.3","type":"ocr"}`,
		`[1,2,3]`,
	} {
		task, err := protocol.DecodeTask([]byte(msg), protocol.Limits{})
		switch {
		case err == nil:
			fmt.Printf("accept %s\n", task.ID)
		case task.ID != "":
			fmt.Printf("reject %s: %s\n", task.ID, protocol.CodeOf(err))
		default:
			fmt.Printf("dead-letter: %s\n", protocol.CodeOf(err))
		}
	}
	// Output:
	// accept t1
	// reject t2: invalid_timeout
	// dead-letter: invalid_id
	// dead-letter: not_object
}
