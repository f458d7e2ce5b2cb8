// Reading a PyTorch-hub hubconf.py without running it: the entry points a
// repository publishes are its top-level functions, and their docs are their
// docstrings, both visible in the source text.
//
//   ```cpp
//   #include "hub/hubconf_py.h"
//   std::string text = R"py(
//   dependencies = ['torch']
//
//   def resnet18(pretrained=False, **kwargs):
//       """ResNet-18 from "Deep Residual Learning for Image Recognition"."""
//       return _resnet('resnet18', pretrained, **kwargs)
//   )py";
//   EMBER_ASSIGN_OR_RETURN(ember::hub::HubConf conf,
//                          ember::hub::parse_hubconf_py(text, "vision/hubconf.py"));
//   // One entry point, "resnet18", with its docstring as doc:
//   if (conf.entry_points_size() != 1) return absl::InternalError("resnet18 was not read");
//   ```
//
// What is read, as torch.hub.list / help see it:
//   - every `def name(...)` (or `async def`) at column 0 whose name does not
//     start with '_', decorated or not, becomes an entry point named after
//     it, listed in sorted order (torch.hub.list sorts too); a later def of
//     the same name replaces an earlier one, as in Python;
//   - its docstring (the first statement of the body, when that is a string
//     literal, in any quoting: ' " ''' """, with r/u prefixes), cleaned the
//     way inspect.cleandoc does (common indentation and blank edges
//     removed), becomes the entry's doc;
//   - its parameters before `*`, `*args` or `**kwargs` (annotations and
//     defaults skipped, `/` dropped) become `positional`: what load()'s
//     positional arguments bind to, in order, as Python binds them;
//   - every name a top-level `from module import a, b as c` binds (the alias
//     when there is one; not `*`, not from __future__, not starting with
//     '_') becomes an entry point too, with no doc and no positional
//     parameters: pytorch/vision's hubconf.py publishes its models this way.
//     What such a name is cannot be known without running Python, so a
//     class or constant imported this way is listed as well (torch.hub.list
//     would leave out the non-callables);
//   - `dependencies = [...]` (strings) becomes python_dependencies.
// Everything else (`import x`, assignments, classes, defs nested in `if`
// blocks or classes, private helpers) is skipped, and strings and comments
// never count as code; of two statements binding one name, the later wins,
// as in Python. Each entry point's builder is its own name and `python` is
// set: load() builds it only when a C++ builder of that name is registered
// (builders.h), and with pretrained = true loads the weights that builder
// publishes (load.h).
//
// read_hubconf reads a repository's hubconf in either format: the
// textproto (hubconf.h) when there is one, this reader otherwise.
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_HUB_HUBCONF_PY_H_
#define EMBER_HUB_HUBCONF_PY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hub/hubconf.h"

namespace ember::hub {

// The file PyTorch-hub repositories publish at their root.
inline constexpr char kHubConfPyFile[] = "hubconf.py";

// Reads `text` (a hubconf.py) as above; `source` names it in messages.
// Errors: InvalidArgument naming the line for an unterminated string or
// bracket, or an entry point name that is not an ASCII identifier.
absl::StatusOr<HubConf> parse_hubconf_py(absl::string_view text, absl::string_view source);

// Reads and parses <repo_dir>/hubconf.textproto, or, when there is none,
// <repo_dir>/hubconf.py. NotFound when the repository publishes neither.
absl::StatusOr<HubConf> read_hubconf(const std::string& repo_dir);

}  // namespace ember::hub

#endif  // EMBER_HUB_HUBCONF_PY_H_
