"""Object storage as rented hosts reach it: per-job scoped, short-lived credentials and their renewal."""
