// The `hub` command: fetch repositories, list and document their entry points
// and download weights, from the shell.
//
//   hub fetch owner/repo[:ref] [--force-reload] [--hub-dir D]
//       prints the cached folder
//   hub list owner/repo[:ref] [...]          prints one entry point per line
//   hub help owner/repo[:ref] ENTRY [...]    prints the entry point's doc
//   hub weights URL [--model-dir D] [--check-hash] [--hub-dir D]
//       prints the file and its tensors
//   hub --help | --version
//
// Other flags: --local (the repository is a directory), --base-url U (instead
// of $EMBER_HUB_BASE_URL / https://github.com), --no-progress.
// Exit status: 0 on success, 1 when the operation fails (the reason on
// stderr), 2 for a usage error. Output goes to stdout; errors and the
// progress bar (on a terminal only) to stderr. Everything printed that comes
// from a repository or a checkpoint (names, docs, messages quoting them) has
// control characters and non-UTF-8 bytes escaped (\x1b ...).
#include "hub/hub.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "hub/hub_dir.h"
#include "hub/load_state_dict_from_url.h"
#include "serialization/printable.h"
#include "serialization/serialization.h"
#include "tools/version.h"

namespace {

constexpr char kUsage[] =
    "usage: hub fetch REPO [--force-reload] [--hub-dir D] [--local] "
    "[--base-url U] [--no-progress]\n"
    "       hub list REPO [same flags]\n"
    "       hub help REPO ENTRY [same flags]\n"
    "       hub weights URL [--model-dir D] [--check-hash] [--hub-dir D] "
    "[--no-progress]\n"
    "       hub --help | --version\n"
    "REPO is owner/repo[:ref] (a tag or branch; default branch master, else "
    "main),\n"
    "or a directory with --local. The hub directory is --hub-dir, else\n"
    "$TORCH_HUB_DIR, $TORCH_HOME/hub, $XDG_CACHE_HOME/torch/hub, an existing\n"
    "~/.torch/hub or ~/.cache/torch/hub, else ~/.torch/hub (created).\n"
    "Exit status: 0 ok, 1 the operation failed (the reason on stderr), 2 usage "
    "error.\n";

int Usage(const std::string& why) {
  std::cerr << "hub: " << why << "\n" << kUsage;
  return 2;
}

// Names, docs and messages come from repositories and checkpoints: printed
// escaped, so that they cannot drive the terminal (printable.h).
int Failed(const absl::Status& status) {
  std::cerr << "hub: " << ember::serialization::escape_for_terminal(status.message()) << "\n";
  return 1;
}

int Main(std::vector<std::string> args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::cout << ember::tools::version_line("hub") << "\n";
    return 0;
  }
  const std::string command = args[0];
  std::vector<std::string> positional;
  ember::hub::HubOptions options;
  ember::hub::LoadFromUrlOptions weights;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string dir;
    if (a == "--force-reload") {
      options.force_reload = true;
    } else if (a == "--local") {
      options.source = ember::hub::Source::kLocal;
    } else if (a == "--no-progress") {
      options.download.progress = false;
      weights.progress = false;
    } else if (a == "--check-hash") {
      weights.check_hash = true;
    } else if (a == "--hub-dir") {
      if (!value(&dir)) return Usage("--hub-dir needs a directory");
      ember::hub::set_dir(dir);
    } else if (a == "--model-dir") {
      if (!value(&weights.model_dir)) return Usage("--model-dir needs a directory");
    } else if (a == "--base-url") {
      if (!value(&options.base_url)) return Usage("--base-url needs a URL");
    } else if (a.rfind("--", 0) == 0) {
      return Usage("unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (command == "fetch" || command == "list") {
    if (positional.size() != 1) return Usage(command + " takes one repository");
    if (command == "fetch") {
      absl::StatusOr<ember::hub::Repository> repo =
          ember::hub::open_repository(positional[0], options);
      if (!repo.ok()) return Failed(repo.status());
      std::cout << ember::serialization::escape_for_terminal(repo->dir) << "\n";
      return 0;
    }
    absl::StatusOr<std::vector<std::string>> names = ember::hub::list(positional[0], options);
    if (!names.ok()) return Failed(names.status());
    for (const std::string& n : *names)
      std::cout << ember::serialization::escape_for_terminal(n) << "\n";
    return 0;
  }
  if (command == "help") {
    if (positional.size() != 2) return Usage("help takes a repository and an entry point");
    absl::StatusOr<std::string> doc = ember::hub::help(positional[0], positional[1], options);
    if (!doc.ok()) return Failed(doc.status());
    std::cout << ember::serialization::escape_for_terminal(*doc, /*keep_newlines=*/true) << "\n";
    return 0;
  }
  if (command == "weights") {
    if (positional.size() != 1) return Usage("weights takes one URL");
    weights.download = options.download;
    absl::StatusOr<std::string> path = ember::hub::download_checkpoint(positional[0], weights);
    if (!path.ok()) return Failed(path.status());
    absl::StatusOr<ember::StateDict> sd = ember::load(*path);
    if (!sd.ok()) return Failed(sd.status());
    std::cout << ember::serialization::escape_for_terminal(*path) << "\n";
    for (const auto& [name, t] : *sd) {
      std::cout << ember::serialization::escape_for_terminal(name) << " " << t.dtype() << " ["
                << absl::StrJoin(t.sizes(), ", ") << "]\n";
    }
    return 0;
  }
  return Usage("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) { return Main(std::vector<std::string>(argv + 1, argv + argc)); }
