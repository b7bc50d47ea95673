"""What a person reads: the summary line, the verdict table, status, explain, the HTML
report and its Markdown summary, the trace, the parameter reference. Views of data only
(data modules first, renderers after); imports engine/ and the layers before it.
"""
