"""What is kept on this machine: the content-addressed store, its stat cache, locks, gc,
build history, the event log and the upload queue; each module documents its on-disk
format at its top. Imports plan/, declare/ and the foundations.
"""
