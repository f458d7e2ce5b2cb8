#!/bin/sh
# Bazel's --workspace_status_command (.bazelrc): the commit the tools report
# in --version. A volatile key (no STABLE_ prefix), so that a new commit does
# not relink every tool and rerun their tests; stamped outputs pick it up when
# they are rebuilt for another reason, and a release from a clean checkout
# always has it. Outside a git checkout (a source archive) it says "unknown".
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "EMBER_GIT_COMMIT $commit"
