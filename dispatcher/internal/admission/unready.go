package admission

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mlsched/mlsched/shared/protocol"
)

// unreadyOnly explains a task that no live node serves when its only
// candidates are hosted but unready (a model server down, an exec process
// not started): which models, on which nodes, and why. A task waiting for
// them would wait MLSCHED_NO_NODE_WAIT in silence and then be rejected;
// it is rejected at once instead, with this text. It returns "" when some
// candidate is not hosted anywhere either (a node may be starting: wait),
// or when one is only cooling down (it comes back by itself).
func unreadyOnly(live []protocol.Heartbeat, typ string, allow []string) string {
	var found []string
	for _, hb := range live {
		for _, u := range hb.Unready {
			if !slices.Contains(u.Types, typ) || !protocol.AllowedBy(allow, u.Name) {
				continue
			}
			if u.Transient {
				return ""
			}
			found = append(found, fmt.Sprintf("%s on %s (%s)", u.Name, hb.Node, u.Reason))
		}
	}
	if len(found) == 0 {
		return ""
	}
	sort.Strings(found)
	return "its only candidates are unready: " + strings.Join(found, "; ")
}
