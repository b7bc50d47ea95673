"""hefbuild: declarative, content-addressed builds of LLMs for edge NPUs, on pydoit.

Data flows one way: specs (load) -> plan -> key -> store -> executors -> report.
The planning side imports nothing heavy so `doit list` stays fast.
"""

__version__ = "0.1.0"
