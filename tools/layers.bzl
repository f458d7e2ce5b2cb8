"""Ember's layers, enforced by Bazel visibility.

Note [Layers]
Each area builds on the areas below it and on nothing above: LAYERS lists,
for every area, the areas its targets may depend on (base/ and third_party/
are open to all). An area's API targets are visible, in Ember's own
workspace, only to its own packages, to the areas that list it, and to the
top (the root package, tools/, examples/), so a target that reaches upward
fails to build with Bazel's visibility error. The top-level README's "Layers"
section states the same table.

A test of a lower area that needs a higher one (multiprocessing's spawn of
nn modules, its queue's refusal of autograd graphs) depends on that area's
`for_lower_tests` target: testonly, so Bazel refuses it to any library or
binary.

A workspace that builds Ember as a dependency sees every API target as
public: layering is a rule of Ember's own code, not of its users'.
"""

# Area -> the areas it may depend on.
LAYERS = {
    "tensor": [],
    "cuda": ["tensor"],
    "serialization": ["tensor", "cuda"],
    "autograd": ["tensor", "cuda"],
    "multiprocessing": ["tensor", "cuda", "serialization"],
    "distributed": ["tensor", "cuda", "serialization"],
    "data": ["tensor", "cuda", "serialization", "multiprocessing", "distributed"],
    "nn": ["tensor", "cuda", "serialization", "autograd", "multiprocessing"],
    "hub": ["tensor", "cuda", "serialization", "autograd", "multiprocessing", "nn"],
    "parallel": [
        "tensor",
        "cuda",
        "serialization",
        "autograd",
        "multiprocessing",
        "distributed",
        "data",
        "nn",
    ],
}

# Packages that may use every area.
TOP = [
    "//",
    "//examples/...",
    "//tools/...",
]

def layer_groups():
    """One package_group per area: the packages that may use its API
    (//tools:<area>_users). Called once, from tools/BUILD.bazel."""
    for area in LAYERS:
        users = ["//%s/..." % area]
        for other, below in LAYERS.items():
            if area in below:
                users.append("//%s/..." % other)
        native.package_group(
            name = area + "_users",
            packages = users + TOP,
        )

def layer_api(area):
    """The visibility of `area`'s API targets: the areas above it, in
    Ember's own workspace; public in a workspace that depends on Ember."""
    if area not in LAYERS:
        fail("layer_api: unknown area '%s'; add it to LAYERS in tools/layers.bzl" % area)
    if native.repository_name() != "@":
        return ["//visibility:public"]
    return ["//tools:%s_users" % area]

def lower_tests():
    """The visibility of a testonly target any test may use: a
    `for_lower_tests` target (see Note [Layers]), the no-CUDA test case."""
    return ["//visibility:public"]
