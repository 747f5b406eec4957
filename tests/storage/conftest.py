"""Storage tests: the enforcing moto (authentication on, session policies and expiry as AWS applies them)."""

from fakes.moto_sts import sts_s3, sts_server  # noqa: F401  (fixtures)
