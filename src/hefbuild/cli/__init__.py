"""The adapter to doit, at the very top: task creation, the reporter, the project's
session, and the extra commands (explain, status, gc, store, report, cache-key). The only
layer that imports doit; it may import every layer.
"""
