package protocol

import "strings"

// A versioned model is routed as family@version ("fraud@v8"): its
// statistics, breakers and dispatches are its own, and a task's allow-list
// entry "fraud" admits every version of the family while "fraud@v8" pins
// one (ModelAllowed). A model without a version is its own family.

// ModelName is the routing name of a family's version ("" version: the
// family itself).
func ModelName(family, version string) string {
	if version == "" {
		return family
	}
	return family + "@" + version
}

// ModelFamily is the family of a routing name: what precedes the '@', or
// the whole name.
func ModelFamily(name string) string {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		return name[:i]
	}
	return name
}

// ModelVersion is the version of a routing name ("" without one).
func ModelVersion(name string) string {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		return name[i+1:]
	}
	return ""
}

// ModelAllowed reports whether an allow-list entry admits a model: the
// same name, or the model's family when the entry names no version.
func ModelAllowed(entry, model string) bool {
	if entry == model {
		return true
	}
	return len(model) > len(entry) && model[len(entry)] == '@' && model[:len(entry)] == entry &&
		strings.IndexByte(entry, '@') < 0
}

// AllowedBy reports whether an allow-list admits a model (an empty list
// admits every model).
func AllowedBy(list []string, model string) bool {
	if len(list) == 0 {
		return true
	}
	for _, e := range list {
		if ModelAllowed(e, model) {
			return true
		}
	}
	return false
}
