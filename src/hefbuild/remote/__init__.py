"""The remote cache behind the local store: HTTP and shared-folder transports, the CAS,
the action cache (REAPI ActionResult), signing. Nothing is trusted by name. Imports store/
and the layers before it.
"""
