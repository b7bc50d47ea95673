"""Remote caching: sharing build results through a Bazel HTTP remote cache."""
