"""From an accepted estimate to a rented host: offers, spec, staging, preflight, gates, the launch.

May import money/, record/ and the ground (bot/engine/*.py but service.py).
"""
