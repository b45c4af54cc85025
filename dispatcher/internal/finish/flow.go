package finish

import "github.com/mlsched/mlsched/shared/protocol"

// FlowBands and FlowCodes label Counters.Ended: the priority bands and
// the codes of tasks flow control ends without starting them.
var (
	FlowBands = [3]string{"high", "normal", "low"}
	FlowCodes = [3]protocol.Code{protocol.CodeShed, protocol.CodeExpired, protocol.CodeQuotaExceeded}
)
