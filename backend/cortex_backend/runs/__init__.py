"""Source runs: a user's own code on this host, in a sandbox, with outputs collected and hashed.

`spec` checks a submission against this backend, `archive` verifies and unpacks the uploaded source,
`launcher` starts and stops the `sandbox` supervisor process, `outputs` collects the declared files,
`uids` hands out the unprivileged uids runs execute as, and `manager` (the service layer) ties the
lifecycle together. Importing this package imports none of them.
"""
