"""doc_examples_test: compiles (and runs) the C++ examples of the files named.

Each test is one generated .cc (extract.py), so its compile time grows with
the number of examples; BUILD.bazel splits the documentation by area into
several tests that build in parallel.
"""

load("//tools:copts.bzl", "ember_cc_test")

def doc_examples_test(name, docs, deps = [], data = [], tags = []):
    """A GoogleTest named `name` holding every ```cpp example of `docs`.

    Args:
      name: the test's name; the generated source is `name`.cc.
      docs: README.md files and headers (labels), each with an example.
      deps: the libraries the examples include.
      data: runtime files the examples need (e.g. the shm manager).
      tags: the test's tags.
    """
    native.genrule(
        name = name + "_src",
        srcs = docs,
        outs = [name + ".cc"],
        cmd = "/usr/bin/python3 $(location :extract.py) $@ $(SRCS)",
        tools = [":extract.py"],
    )
    ember_cc_test(
        name = name,
        srcs = [name + ".cc"],
        data = data,
        tags = tags,
        deps = deps + [
            "//tensor:status_macros",
            "//third_party/abseil:status",
        ],
    )
