"""The rebuilder: for one action, decide (its key and why), find (local store, then
remote), build (an executor, under a watch), install (into build/) and record (events,
history, the fast path). doit is the scheduler above it. Imports every layer before it.
"""
